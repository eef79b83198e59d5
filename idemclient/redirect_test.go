package idemclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// An http.Client over the transport follows redirects: a 307 or 308 to
// another path resends the method and the body (rewound), with a key, and
// the target's 503 is retried with that key and the body again; a 303
// becomes a GET, which carries no key and no body, and whose 503 is
// returned as it came (a GET is not covered).
func TestRedirects(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status     int
		wantMethod string
		wantBody   string
		wantKey    bool
		wantStatus int
		wantHits   int
	}{
		{http.StatusTemporaryRedirect, "POST", `{"sku":"BOOK-1"}`, true, http.StatusCreated, 2},
		{http.StatusPermanentRedirect, "POST", `{"sku":"BOOK-1"}`, true, http.StatusCreated, 2},
		{http.StatusSeeOther, "GET", "", false, http.StatusServiceUnavailable, 1},
	} {
		t.Run(http.StatusText(c.status), func(t *testing.T) {
			t.Parallel()
			type hit struct{ method, key, body string }
			var mu sync.Mutex
			var target []hit
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/old" {
					io.Copy(io.Discard, r.Body)
					w.Header().Set("Location", "/new")
					w.WriteHeader(c.status)
					return
				}
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				target = append(target, hit{r.Method, r.Header.Get("Idempotency-Key"), string(b)})
				n := len(target)
				mu.Unlock()
				if n == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			defer srv.Close()
			client := &http.Client{Transport: fast(nil)}
			resp, err := client.Post(srv.URL+"/old", "application/json", strings.NewReader(`{"sku":"BOOK-1"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if resp.StatusCode != c.wantStatus || len(target) != c.wantHits {
				t.Fatalf("%d after %d requests to the target; want %d after %d", resp.StatusCode, len(target), c.wantStatus, c.wantHits)
			}
			for i, h := range target {
				if h.method != c.wantMethod || h.body != c.wantBody || (h.key != "") != c.wantKey {
					t.Errorf("target request %d: %+v; want %s, body %q, key %v", i+1, h, c.wantMethod, c.wantBody, c.wantKey)
				}
			}
			if c.wantKey && c.wantHits > 1 && target[0].key != target[1].key {
				t.Errorf("the retry at the target carried key %q, the first attempt %q", target[1].key, target[0].key)
			}
		})
	}
}
