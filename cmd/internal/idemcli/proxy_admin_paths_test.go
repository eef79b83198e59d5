package idemcli

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/obstest"
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
		var stderr obstest.LogBuffer
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

// On every store the proxy runs on (Redis, which cannot list its records,
// included): the page loads, an eviction by key of a request in flight is
// refused and keeps it, and once the request is answered its eviction
// makes the next request with the key run again upstream.
func TestProxyAdminStores(t *testing.T) {
	t.Parallel()
	for _, b := range proxyBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t)
			release, arrived := make(chan struct{}), make(chan struct{}, 1)
			up.on("/slow", func(w http.ResponseWriter, r *http.Request, n int) {
				arrived <- struct{}{}
				<-release
				w.WriteHeader(http.StatusCreated)
			})
			var stderr obstest.LogBuffer
			base := startProxyLog(t, &stderr, append(b.flags(t), "-upstream", up.URL, "-admin-token", proxyAdminToken)...)
			auth := []string{"Authorization", "Bearer " + proxyAdminToken}
			if a := send(t, "GET", base+"/admin/", "", "", auth...); a.status != http.StatusOK {
				t.Fatalf("GET /admin/: %d %s", a.status, a.body)
			}
			key := newKey("admin-store")
			evict := func() int {
				t.Helper()
				req, _ := http.NewRequest("POST", base+"/admin/evict", strings.NewReader("key="+key+"&confirm=yes"))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set(auth[0], auth[1])
				resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			done := make(chan answer, 1)
			go func() { done <- send(t, "POST", base+"/slow", key, `{"n":1}`) }()
			<-arrived
			if code := evict(); code != http.StatusConflict {
				t.Errorf("evict of a request in flight: %d, want 409", code)
			}
			if a := send(t, "POST", base+"/slow", key, `{"n":1}`); a.status != http.StatusConflict {
				t.Errorf("a retry during the execution: %d, want 409 (the record kept)", a.status)
			}
			close(release)
			if a := <-done; a.status != http.StatusCreated {
				t.Fatalf("the slow request: %d", a.status)
			}
			up.wantCalls(t, "/slow", 1)
			if code := evict(); code != http.StatusSeeOther {
				t.Fatalf("evict of an answered request: %d, want 303", code)
			}
			go func() { done <- send(t, "POST", base+"/slow", key, `{"n":1}`) }()
			<-arrived
			if a := <-done; a.status != http.StatusCreated || a.replayed() {
				t.Fatalf("after the eviction: %d, replayed %v; want a new execution", a.status, a.replayed())
			}
			up.wantCalls(t, "/slow", 2)
		})
	}
}
