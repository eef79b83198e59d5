package sqlite_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStoreDoesNotCompileDriver: a program that imports sqlstore for
// PostgreSQL or MySQL never builds modernc.org/sqlite (about 50 s and
// 1.3 GB of memory cold); only this package imports it.
func TestStoreDoesNotCompileDriver(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	for pkg, want := range map[string]bool{
		"github.com/idemkit/idem/sqlstore":        false,
		"github.com/idemkit/idem/sqlstore/sqlite": true,
	} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		if got := strings.Contains(string(out), "modernc.org/sqlite\n"); got != want {
			t.Errorf("%s depends on modernc.org/sqlite: %v, want %v", pkg, got, want)
		}
	}
}
