package idemcli

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An address of -metrics-listen in use ends the proxy at once, as one of
// -listen does: exit status 1, a message that names the flag, and no
// database created.
func TestProxyMetricsListenInUse(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	db := filepath.Join(t.TempDir(), "p.db")
	var stderr bytes.Buffer
	code := Main(context.Background(), []string{"proxy", "-listen", "127.0.0.1:0", "-upstream", "http://127.0.0.1:1",
		"-store", "sqlite:" + db, "-metrics-listen", busy.Addr().String()}, strings.NewReader(""), io.Discard, &stderr)
	if code != exitFail || !strings.Contains(stderr.String(), "-metrics-listen "+busy.Addr().String()) {
		t.Errorf("exit %d, %q; want exit 1 naming -metrics-listen and the address", code, stderr.String())
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("the database was created before the metrics address was found in use (stat: %v)", err)
	}
}
