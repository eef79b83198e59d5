package idemcli

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
)

const proxyAdminToken = "proxy-operator-token-0123"

// With -admin-token, /admin/ is the operator page (not the upstream's):
// it lists a key's record, and its eviction makes the next request with
// the key run again upstream. The log names the record by its hash.
func TestProxyAdmin(t *testing.T) {
	up := newUpstream(t)
	var stderr obstest.LogBuffer
	base := startProxyLog(t, &stderr, "-upstream", up.URL, "-store", "sqlite:"+filepath.Join(t.TempDir(), "p.db"), "-admin-token", proxyAdminToken)
	if a := send(t, "POST", base+"/orders", "proxy-key-1", `{"n":1}`); a.status != http.StatusCreated {
		t.Fatalf("first request: %d %s", a.status, a.body)
	}
	up.wantCalls(t, "/orders", 1)
	if a := send(t, "GET", base+"/admin/", "", ""); a.status != http.StatusUnauthorized {
		t.Fatalf("GET /admin/ without the token: %d, want 401", a.status)
	}
	if a := send(t, "GET", base+"/admin/", "", "", "Authorization", "Bearer wrong-wrong-wrong-wrong"); a.status != http.StatusUnauthorized {
		t.Fatalf("GET /admin/ with a wrong token: %d, want 401", a.status)
	}
	up.wantCalls(t, "/admin/", 0)
	hash := idem.HashKey("", "proxy-key-1")
	page := send(t, "GET", base+"/admin/", "", "", "Authorization", "Bearer "+proxyAdminToken)
	if page.status != http.StatusOK || !strings.Contains(page.body, `data-hash="`+hash+`"`) {
		t.Fatalf("operator page: %d, record %s not listed:\n%s", page.status, hash, page.body)
	}
	req, _ := http.NewRequest("POST", base+"/admin/evict", strings.NewReader("key=proxy-key-1&confirm=yes"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+proxyAdminToken)
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("evict: %d", resp.StatusCode)
	}
	// The key was evicted: the same request runs again upstream.
	if a := send(t, "POST", base+"/orders", "proxy-key-1", `{"n":1}`); a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("after the eviction: %d, replayed %v", a.status, a.replayed())
	}
	up.wantCalls(t, "/orders", 2)
	logs := stderr.String()
	if !strings.Contains(logs, "record evicted") || !strings.Contains(logs, "key_hash="+hash) || strings.Contains(logs, "proxy-key-1") {
		t.Fatalf("the eviction's log line:\n%s", logs)
	}
}

// Without a token, /admin/ is the upstream's like any other path.
func TestProxyAdminOff(t *testing.T) {
	t.Setenv(adminTokenEnv, "")
	up := newUpstream(t)
	base := startProxy(t, "-upstream", up.URL, "-store", "sqlite:"+filepath.Join(t.TempDir(), "p.db"))
	if a := send(t, "GET", base+"/admin/", "", "", "Authorization", "Bearer "+proxyAdminToken); a.status != http.StatusCreated {
		t.Fatalf("GET /admin/ without -admin-token: %d, want the upstream's 201", a.status)
	}
	up.wantCalls(t, "/admin/", 1)
}
