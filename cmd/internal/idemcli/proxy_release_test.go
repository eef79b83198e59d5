package idemcli

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/obstest"
)

// The upstream's answers that the proxy must not store: one that says
// "try again" (the 409 PROCESSING with Retry-After of an upstream that is
// itself idempotent and still running, met by a retry after an ambiguous
// timeout and the end of the proxy's lease; 429; 503) was replayed for
// 24 h, and the client stopped retrying. An authentication refusal (a 401
// for a missing X-User-ID, as shopd answers behind the README's example;
// 403; 407) was replayed after the caller added the header. Each is now
// released: the retry reaches the upstream, and its 201 is what is stored.
func TestProxyReleasesTryAgainAndAuth(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	created := func(w http.ResponseWriter, n int) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "created by call %d", n)
	}
	up.on("/processing", func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			idemhttp.WriteProblem(w, http.StatusConflict, idemhttp.CodeProcessing, "Processing", "still running")
			return
		}
		created(w, n)
	})
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		up.on(fmt.Sprintf("/busy/%d", status), func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 1 {
				http.Error(w, "busy", status)
				return
			}
			created(w, n)
		})
	}
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired} {
		up.on(fmt.Sprintf("/auth/%d", status), func(w http.ResponseWriter, r *http.Request, n int) {
			if r.Header.Get("X-User-ID") == "" {
				http.Error(w, "who are you?", status)
				return
			}
			created(w, n)
		})
	}
	base := startProxy(t, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL)

	for _, path := range []string{"/processing", "/busy/429", "/busy/503", "/auth/401", "/auth/403", "/auth/407"} {
		t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
			key := newKey("release")
			first := send(t, http.MethodPost, base+path, key, `{"sku":"A-1"}`)
			if first.status < 400 || first.replayed() {
				t.Fatalf("first: %d %v %s; want the upstream's refusal", first.status, first.header, first.body)
			}
			retry := send(t, http.MethodPost, base+path, key, `{"sku":"A-1"}`, "X-User-ID", "u1")
			if retry.status != http.StatusCreated || retry.body != "created by call 2" || retry.replayed() {
				t.Fatalf("retry: %d %v %s; want the upstream's 201 from a second call, not the refusal replayed",
					retry.status, retry.header, retry.body)
			}
			again := send(t, http.MethodPost, base+path, key, `{"sku":"A-1"}`, "X-User-ID", "u1")
			if again.status != http.StatusCreated || again.body != retry.body || !again.replayed() {
				t.Fatalf("third: %d %v %s; want the 201 replayed", again.status, again.header, again.body)
			}
			up.wantCalls(t, path, 2)
		})
	}
}

// The proxy's own log lines identify a key by its hash (idem.key_hash),
// as every idem log does unless keys are logged on purpose: the lines
// about an answer that broke off carried the raw key ("key", l.Key).
func TestProxyLogsNoRawKey(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	up.on("/pay", func(w http.ResponseWriter, r *http.Request, n int) { answerBreaksOff(t, w) })
	for _, policy := range []string{ambiguousKeep, ambiguousRelease} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			stderr := &obstest.LogBuffer{}
			base := startProxyLog(t, stderr, "-store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "-upstream", up.URL,
				"-lease", "1m", "-ambiguous", policy, "-scope-header", "X-Api-Key")
			key := newKey("secret-key")
			// The answer breaks off (and, under release, the retry's too).
			for range 2 {
				req, _ := http.NewRequest(http.MethodPost, base+"/pay", strings.NewReader(`{}`))
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("X-Api-Key", "tenant-1")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
			}
			logs := stderr.String()
			if !strings.Contains(logs, "outcome unknown") {
				t.Fatalf("no line about the answer that broke off:\n%s", logs)
			}
			if strings.Contains(logs, key) {
				t.Errorf("the log holds the raw key %q:\n%s", key, logs)
			}
			if want := idem.LogKeyHash + "=" + idem.HashKey(hashScope("tenant-1"), key); !strings.Contains(logs, want) {
				t.Errorf("the log does not identify the key by %s:\n%s", want, logs)
			}
		})
	}
}
