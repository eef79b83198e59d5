package idemcli

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/obstest"
)

// idem proxy -metrics-listen serves the Prometheus metrics of its
// decisions on an address of its own: after a first request, its replay
// and a reuse of the key with another body, the counters of the covered
// route moved once each, the store's acquires are counted, and no key
// appears.
func TestProxyMetrics(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	var stderr obstest.LogBuffer
	stdout := &obstest.LogBuffer{}
	base := startProxyOut(t, stdout, &stderr, "-upstream", up.URL, "-store", "sqlite:"+filepath.Join(t.TempDir(), "p.db"),
		"-routes", "POST /orders/*", "-metrics-listen", "127.0.0.1:0")
	m := regexp.MustCompile(`metrics: (http://\S+/metrics)`).FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("no metrics address in the proxy's output:\n%s", stdout)
	}
	key := "metrics-key-" + newKey("k")
	if a := send(t, "POST", base+"/orders/1", key, `{"n":1}`); a.status != http.StatusCreated {
		t.Fatalf("first: %d", a.status)
	}
	if a := send(t, "POST", base+"/orders/1", key, `{"n":1}`); !a.replayed() {
		t.Fatalf("second: %d, not a replay", a.status)
	}
	if a := send(t, "POST", base+"/orders/1", key, `{"n":2}`); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("other body: %d, want 422", a.status)
	}
	up.wantCalls(t, "/orders/1", 1)
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(m[1])
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		if strings.Contains(body, `outcome="mismatch"`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{
		`idem_requests_total{outcome="executed",route="POST /orders/*"} 1`,
		`idem_requests_total{outcome="replayed",route="POST /orders/*"} 1`,
		`idem_requests_total{outcome="mismatch",route="POST /orders/*"} 1`,
		`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="sqlite"} 3`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %q:\n%s", want, grepIdem(body))
		}
	}
	if strings.Contains(body, key) {
		t.Error("/metrics holds the idempotency key")
	}
}

func grepIdem(s string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "idem_") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
