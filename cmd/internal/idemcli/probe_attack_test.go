package idemcli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/cmd/internal/probe"
)

// TestProbeInterrupted: a probe interrupted while its first request
// waits for an answer says so (kind interrupted, no verdict), not that
// the server did not answer.
func TestProbeInterrupted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel() // as a Ctrl-C would
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	var stdout, stderr bytes.Buffer
	code := Main(ctx, []string{"probe", "-json", "-d", `{"name":"pen"}`, srv.URL + "/items"}, strings.NewReader(""), &stdout, &stderr)
	close(stop)
	var out struct {
		OK    bool `json:"ok"`
		Error struct{ Kind, Message string }
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || code != 1 || out.OK || out.Error.Kind != "interrupted" ||
		strings.Contains(stdout.String(), "server is up") || strings.Contains(stderr.String(), "PASS") {
		t.Errorf("exit %d, %v, stdout %s, stderr %q; want exit 1 and kind interrupted", code, err, stdout.String(), stderr.String())
	}
}

// TestProbeHostileText: an API whose answers hold terminal escapes
// (ESC, BEL, C1 controls, bidirectional overrides), bytes that are not
// UTF-8 and words longer than a line, in its bodies and in the header
// values a reason quotes: the table stays printable text, valid UTF-8,
// within 80 columns, and -json stays valid JSON.
func TestProbeHostileText(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotent-Replayed", "\u009b31m\u202eeurt\xff")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "\u009b2J")
		status := http.StatusCreated
		if n.Add(1)%3 == 0 {
			status = http.StatusConflict
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "{\"id\":%d,\"x\":\"\x1b[2J\x1b]0;pwned\x07\u202e\u0085\x7f%s\"}", n.Load(), strings.Repeat("a", 150))
	}))
	t.Cleanup(srv.Close)
	r := runIdem(t, "", "probe", "-d", `{"a":1}`, srv.URL+"/api")
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL: core failed") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	checkWidth(t, r.stdout)
	checkPrintable(t, r.stdout)
	r = runIdem(t, "", "probe", "-json", "-d", `{"a":1}`, srv.URL+"/api")
	var rep probe.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 1 || len(rep.Checks) != len(probe.Checks) {
		t.Fatalf("-json: exit %d, %v:\n%s", r.code, err, r.stdout)
	}
	for _, c := range rep.Checks {
		checkPrintable(t, c.Reason)
	}
}

// checkPrintable fails the test for what a terminal would not print as
// text: a control character other than a newline, a bidirectional
// control, or bytes that are not UTF-8.
func checkPrintable(t *testing.T, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("not UTF-8: %q", out)
	}
	for _, r := range out {
		if r != '\n' && unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			t.Errorf("%U in %q", r, out)
			return
		}
	}
}

// TestProbeRedirected: a first request redirected (a URL without its
// trailing slash, say) is not blamed on the headers or the body: the
// error names where it points, the URL to probe.
func TestProbeRedirected(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Path+"/", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	r := runIdem(t, "", "probe", "-d", `{"name":"pen"}`, srv.URL+"/items")
	if r.code != 1 || !strings.Contains(r.stderr, "307 Temporary Redirect to "+srv.URL+"/items/") || strings.Contains(r.stderr, "give its headers") {
		t.Errorf("exit %d, stderr %q; want exit 1 and the URL it redirects to", r.code, r.stderr)
	}
}

// TestProbeMoreUsageErrors: headers no request can carry (a line break
// in a value would end the header: "got no answer, check that the
// server is up" said nothing of the flag) and a key header or length
// given empty (they fell back to the defaults) exit 2 naming the flag,
// and send nothing.
func TestProbeMoreUsageErrors(t *testing.T) {
	t.Parallel()
	base, created := api(t, false)
	u := base + "/items"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-H", "X-A: b\r\nX-B: c", u}, "-H: X-A:"},
		{[]string{"-H2", "X-Tenant: b\x01", u}, "-H2: X-Tenant:"},
		{[]string{"-effect-url", base + "/count", "-effect-json-path", "count", "-effect-header", "X-Token: t\nX-B: c", u}, "-effect-header: X-Token:"},
		{[]string{"-header", "", u}, "-header ''"},
		{[]string{"-max-key", "0", u}, "-max-key 0"},
	} {
		r := runIdem(t, "", append([]string{"probe", "-d", `{"name":"pen"}`}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("idem probe %q: exit %d, stderr %q; want exit 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
	if created.Load() != 0 {
		t.Errorf("usage errors sent requests: %d created", created.Load())
	}
}
