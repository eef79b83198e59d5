package idemcli

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// Turning the operator page on takes /admin/ from the upstream and
// nothing else: a request whose path is not clean (doubled slashes, dot
// segments) reaches the upstream as it does without the page, never a
// redirect of the proxy's own; and /admin, not under /admin/, is the
// upstream's too.
func TestProxyAdminLeavesOtherPathsAlone(t *testing.T) {
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, admin := range []bool{false, true} {
		up := newUpstream(t)
		args := []string{"-upstream", up.URL, "-store", "sqlite:" + filepath.Join(t.TempDir(), "p.db")}
		if admin {
			args = append(args, "-admin-token", proxyAdminToken)
		}
		var stderr syncBuffer
		base := startProxyLog(t, &stderr, args...)
		for i, path := range []string{"//orders", "/orders/./x", "/a/../orders", "/admin"} {
			req, _ := http.NewRequest("POST", base+path, strings.NewReader(`{"n":1}`))
			req.Header.Set("Idempotency-Key", "path-key-"+string(rune('a'+i)))
			resp, err := noRedirect.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("admin page %v: POST %s: %d (Location %q), want the upstream's 201", admin, path, resp.StatusCode, resp.Header.Get("Location"))
			}
		}
	}
}
