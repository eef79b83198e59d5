package idemcli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/cmd/internal/probe"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// api serves POST /items (guarded by idemhttp on memstore, keys scoped to
// the X-Tenant header, unless unguarded) that counts what it creates (a
// body holding "refuse" is 400, one holding "fail" 502), and GET /count.
func api(t *testing.T, unguarded bool) (string, *atomic.Int64) {
	t.Helper()
	var created atomic.Int64
	create := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		buf.ReadFrom(r.Body)
		if strings.Contains(buf.String(), "refuse") {
			idemhttp.WriteProblem(w, http.StatusBadRequest, "REFUSED", "Refused", "no")
			return
		}
		if strings.Contains(buf.String(), "fail") {
			idemhttp.WriteProblem(w, http.StatusBadGateway, "UPSTREAM", "Upstream failed", "not now")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, created.Add(1))
	}))
	if !unguarded {
		mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil), Scope: func(r *http.Request) (string, error) {
			return "tenant:" + r.Header.Get("X-Tenant"), nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		create = mw.Handler(create)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /items", create)
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Token") != "t" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, `{"count":%d}`, created.Load())
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, &created
}

type result struct {
	code           int
	stdout, stderr string
}

func runIdem(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), args, strings.NewReader(stdin), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// TestProbePasses runs idem probe against idemhttp with the body from a
// file, the refused body from standard input, flags on both sides of the
// URL, a second caller, a failing body, keys required, and the effect read
// with headers of its own: exit 0, a table with every check passed but
// those that need what this API does not have (a cookie, a retention; a
// 409 that scheduling decides), nothing on standard error (not a
// terminal), and the handler created one item per execution.
func TestProbePasses(t *testing.T) {
	t.Parallel()
	base, created := api(t, false)
	body := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(body, []byte(`{"name":"pen","qty":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runIdem(t, `{"name":"refuse","qty":1}`, "probe", "-d", "@"+body, "-d4xx", "@-", "-n", "5",
		base+"/items",
		"-H", "X-Tenant: a", "-H2", "X-Tenant: b", "-d5xx", `{"name":"fail"}`, "-require-key",
		"-effect-url", base+"/count", "-effect-json-path", "count", "-effect-header", "X-Token: t")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q; stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	for _, c := range probe.Checks {
		if !strings.Contains(r.stdout, " "+c.ID+" ") {
			t.Errorf("no row for %s:\n%s", c.ID, r.stdout)
		}
	}
	na := regexp.MustCompile(`(?m)^  n/a     (\S+) `).FindAllStringSubmatch(r.stdout, -1)
	for _, m := range na {
		if m[1] != "expiry" && m[1] != "private-headers" && m[1] != "retry-after" {
			t.Errorf("%s n/a", m[1])
		}
	}
	if strings.Contains(r.stdout, "  fail ") || !strings.Contains(r.stdout, "\nPASS: core passed; ") || strings.Contains(r.stdout, "Note:") {
		t.Errorf("stdout:\n%s", r.stdout)
	}
	checkWidth(t, r.stdout)
	// 11 executions of the first caller, 2 of the second.
	if created.Load() != 13 {
		t.Errorf("the handler created %d items, want 13 (one per execution)", created.Load())
	}
}

// TestProbeJSON: -json prints the report; a failing API exits 1 with ok
// false and the failing checks marked.
func TestProbeJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		unguarded bool
		code      int
	}{{"idempotent", false, 0}, {"not idempotent", true, 1}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			base, created := api(t, c.unguarded)
			r := runIdem(t, "", "probe", "-json", "-d", `{"name":"pen","qty":2}`, "-d4xx", `{"name":"refuse"}`,
				"-effect-url", base+"/count", "-effect-json-path", "count", "-effect-header", "X-Token: t", base+"/items")
			if r.code != c.code || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q, want exit %d", r.code, r.stderr, c.code)
			}
			var rep struct {
				URL         string `json:"url"`
				Method      string `json:"method"`
				KeyHeader   string `json:"key_header"`
				Concurrency int    `json:"concurrency"`
				DurationMS  int64  `json:"duration_ms"`
				RunID       string `json:"run_id"`
				Checks      []struct {
					ID, Title, Status, Reason, Source string
					Grade, Profile                    string
					Requests, Executions              int
					EffectDelta                       *int64 `json:"effect_delta"`
				} `json:"checks"`
				Effect *struct {
					URL, Path               string
					Before, After, Expected int64
				} `json:"effect"`
				Requests, Passed, Failed, Warnings int
				NA                                 int  `json:"not_applicable"`
				CoreOK                             bool `json:"core_ok"`
				Profiles                           []struct {
					Name         string
					Required, OK bool
					Failed       []string
				} `json:"profiles"`
				OK bool `json:"ok"`
			}
			dec := json.NewDecoder(strings.NewReader(r.stdout))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&rep); err != nil {
				t.Fatalf("%v:\n%s", err, r.stdout)
			}
			if rep.URL != base+"/items" || rep.Method != "POST" || rep.KeyHeader != "Idempotency-Key" || rep.Concurrency != 10 || rep.RunID == "" || len(rep.Checks) != len(probe.Checks) ||
				rep.Effect == nil || rep.Effect.After != created.Load() || rep.Effect.Path != "count" || rep.OK != (c.code == 0) ||
				rep.Passed+rep.Failed+rep.NA+rep.Warnings != len(rep.Checks) || rep.CoreOK != rep.OK || len(rep.Profiles) != len(probe.Profiles) {
				t.Fatalf("report %+v", rep)
			}
			for i, ch := range rep.Checks {
				if ch.ID != probe.Checks[i].ID || ch.Title == "" || ch.Reason == "" || ch.Source == "" ||
					ch.Grade != probe.Checks[i].Grade() || ch.Profile != probe.Checks[i].Profile ||
					(ch.Status != "pass" && ch.Status != "fail" && ch.Status != "n/a" && ch.Status != "warning") || ch.EffectDelta == nil {
					t.Errorf("check %d: %+v", i, ch)
				}
				if ch.ID == "concurrent" && (ch.Status == "fail") != c.unguarded {
					t.Errorf("concurrent %s against %s", ch.Status, c.name)
				}
			}
		})
	}
}

// TestProbeTableFails: a failing API exits 1 with FAIL and the failing
// checks' reasons in the table.
func TestProbeTableFails(t *testing.T) {
	t.Parallel()
	base, _ := api(t, true)
	r := runIdem(t, "", "probe", "-d", `{"name":"pen","qty":2}`, base+"/items")
	if r.code != 1 || !strings.Contains(r.stdout, "\nFAIL: core failed") || !strings.Contains(r.stdout, "  fail    concurrent ") {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestProbeUsageErrors: each bad flag or argument exits 2 with a message
// naming the flag, and sends no request.
func TestProbeUsageErrors(t *testing.T) {
	t.Parallel()
	base, created := api(t, false)
	u := base + "/items"
	var count atomic.Int64
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { count.Add(1) }))
	t.Cleanup(counting.Close)
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no URL"},
		{[]string{u, u}, "one URL only"},
		{[]string{"-H", "NoColon", u}, "-H"},
		{[]string{"-H", "Bad Name: v", u}, "-H"},
		{[]string{"-H", "Idempotency-Key: mine", u}, "-H: holds Idempotency-Key"},
		{[]string{"-effect-header", ": v", u}, "-effect-header"},
		{[]string{"-d", "@" + filepath.Join(t.TempDir(), "missing.json"), u}, "-d @"},
		{[]string{"-d", "@", u}, "-d @"},
		{[]string{"-d", "@-", "-d4xx", "@-", u}, "-d4xx @-"},
		{[]string{"-n", "1", u}, "-n:"},
		{[]string{"-n", "x", u}, "-n"},
		{[]string{"-X", "GET", u}, "-X:"},
		{[]string{"-header", "Bad Name", u}, "-header:"},
		{[]string{"-max-key", "3", u}, "-max-key:"},
		{[]string{"-timeout", "0s", u}, "-timeout"},
		{[]string{"-effect-url", counting.URL, u}, "-effect-url without -effect-json-path"},
		{[]string{"-effect-json-path", "count", u}, "-effect-json-path without -effect-url"},
		{[]string{"-effect-header", "X-Token: t", u}, "-effect-header without -effect-url"},
		{[]string{"-effect-url", counting.URL, "-effect-json-path", "a..b", u}, "-effect-json-path:"},
		{[]string{"ftp://example.com/"}, "URL:"},
		{[]string{"-H2", "NoColon", u}, "-H2"},
		{[]string{"-H2", "Idempotency-Key: k", u}, "-H2: holds Idempotency-Key"},
		{[]string{"-H", "X-User: 1", "-H2", "X-User: 1", u}, "-H2: names no header of identity"},
		{[]string{"-H", "X-User: 1", "-H2", "Content-Type: text/plain", "-H2", "accept: text/html", u}, "-H2: names no header of identity"},
		{[]string{"-d5xx", "@", u}, "-d5xx @"},
		{[]string{"-d", "@-", "-d5xx", "@-", u}, "-d5xx @-"},
		{[]string{"-retention", "-1s", u}, "-retention: negative"},
		{[]string{"-retention", "10ms", u}, "-retention: 10ms is too short"},
		{[]string{u, "-nope"}, "-nope"},
		{[]string{"-nope", u}, "-nope"},
	} {
		r := runIdem(t, "", append([]string{"probe"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || !strings.HasPrefix(r.stderr, "idem probe: ") || r.stdout != "" {
			t.Errorf("idem probe %q: exit %d, stderr %q, stdout %q; want exit 2 and %q", c.args, r.code, r.stderr, r.stdout, c.want)
		}
	}
	if created.Load() != 0 || count.Load() != 0 {
		t.Errorf("usage errors sent requests: %d created, %d effect reads", created.Load(), count.Load())
	}
}

// TestProbeRunErrors: a request the API refuses, and an effect that
// cannot be read, exit 1 with the flags to fix.
func TestProbeRunErrors(t *testing.T) {
	t.Parallel()
	base, created := api(t, false)
	r := runIdem(t, "", "probe", "-d", `{"name":"refuse"}`, base+"/items")
	if r.code != 1 || !strings.Contains(r.stderr, "400 Bad Request") || !strings.Contains(r.stderr, "-H") || !strings.Contains(r.stderr, "-d") {
		t.Errorf("refused first request: exit %d, stderr %q", r.code, r.stderr)
	}
	// GET /count needs X-Token: without -effect-header it answers 401.
	r = runIdem(t, "", "probe", "-d", `{"name":"pen"}`, "-effect-url", base+"/count", "-effect-json-path", "count", base+"/items")
	if r.code != 1 || !strings.Contains(r.stderr, "-effect-url") || !strings.Contains(r.stderr, "401") {
		t.Errorf("unreadable effect: exit %d, stderr %q", r.code, r.stderr)
	}
	// Nothing listens on a closed server's address.
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	r = runIdem(t, "", "probe", "-d", `{"name":"pen"}`, closed.URL+"/items")
	if r.code != 1 || !strings.Contains(r.stderr, "got no answer") || !strings.Contains(r.stderr, "server is up") {
		t.Errorf("no server: exit %d, stderr %q", r.code, r.stderr)
	}
	if created.Load() != 0 {
		t.Errorf("%d created", created.Load())
	}
}

// TestProbeJSONErrors: with -json, before or after the URL or a bad flag,
// a probe that cannot run prints {ok: false, error: {kind, message}} on
// standard output (and the message on standard error), with the exit
// status of the error.
func TestProbeJSONErrors(t *testing.T) {
	t.Parallel()
	base, created := api(t, false)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, c := range []struct {
		args []string
		code int
		kind string
		want string
	}{
		{[]string{"-json", "-n", "1", base + "/items"}, 2, "usage", "-n:"},
		{[]string{"-json", "-nope", base + "/items"}, 2, "usage", "-nope"},
		{[]string{"-json", base + "/items", "-nope"}, 2, "usage", "-nope"},
		{[]string{"-json", "-d", `{"name":"refuse"}`, base + "/items"}, 1, "not_accepted", "400 Bad Request"},
		{[]string{"-json", "-d", `{"name":"pen"}`, closed.URL + "/items"}, 1, "no_answer", "got no answer"},
		{[]string{"-json", "-d", `{"name":"pen"}`, "-effect-url", base + "/count", "-effect-json-path", "count", base + "/items"}, 1, "effect", "401"},
		// Flags may follow the URL, -json among them; the flag parser
		// stops at a bad flag, and a -json after it counts all the same (a
		// CI job that parses standard output got nothing).
		{[]string{base + "/items", "-json", "-n", "1"}, 2, "usage", "-n:"},
		// The flag parser stops at a bad flag: a -json after it counts.
		{[]string{"-n", "x", "-json", base + "/items"}, 2, "usage", "-n"},
		{[]string{"-nope", "--json", base + "/items"}, 2, "usage", "-nope"},
		{[]string{base + "/items", "-nope", "-json=true"}, 2, "usage", "-nope"},
		{[]string{base + "/items", "-json", "-nope"}, 2, "usage", "-nope"},
		{[]string{base + "/items", "-json", "-effect-url", base + "/count"}, 2, "usage", "-effect-url without -effect-json-path"},
		{[]string{base + "/items", "-d", `{"name":"refuse"}`, "-json"}, 1, "not_accepted", "400 Bad Request"},
		{[]string{closed.URL + "/items", "-json", "-d", `{"name":"pen"}`}, 1, "no_answer", "got no answer"},
	} {
		r := runIdem(t, "", append([]string{"probe"}, c.args...)...)
		var out struct {
			OK    *bool `json:"ok"`
			Error struct {
				Kind    string `json:"kind"`
				Message string `json:"message"`
			} `json:"error"`
		}
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&out); err != nil || r.code != c.code || out.OK == nil || *out.OK || out.Error.Kind != c.kind ||
			!strings.Contains(out.Error.Message, c.want) || !strings.Contains(r.stderr, out.Error.Message) {
			t.Errorf("idem probe %q: exit %d, %v, stdout %s, stderr %q; want exit %d, kind %s, %q", c.args, r.code, err, r.stdout, r.stderr, c.code, c.kind, c.want)
		}
	}
	if created.Load() != 0 {
		t.Errorf("%d created", created.Load())
	}
}

func TestProbeHelp(t *testing.T) {
	t.Parallel()
	r := runIdem(t, "", "help", "probe")
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for _, c := range probe.Checks {
		if !strings.Contains(r.stdout, "  "+c.ID+" ("+c.Source+")\n") {
			t.Errorf("help lacks check %s (%s)", c.ID, c.Source)
		}
	}
	checkWidth(t, r.stdout)
	for _, f := range []string{"-profile", "-X", "-H", "-H2", "-d", "-d4xx", "-d5xx", "-require-key", "-retention", "-n", "-header", "-max-key", "-timeout", "-json", "-effect-url", "-effect-json-path", "-effect-header", "-k", "-insecure"} {
		if !strings.Contains(r.stdout, "\n  "+f+" ") && !strings.Contains(r.stdout, "\n  "+f+"\n") && !strings.Contains(r.stdout, "\n  "+f+"\t") {
			t.Errorf("help lacks flag %s", f)
		}
	}
	if r2 := runIdem(t, "", "probe", "-h"); r2.code != 0 || r2.stdout != r.stdout {
		t.Errorf("idem probe -h: exit %d, differs from idem help probe", r2.code)
	}
}

// TestProgressBar: nothing in the first second or off a terminal; then a
// bar, erased at the end.
func TestProgressBar(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Now()
	b := newProgressBar(&buf, true)
	b.now = func() time.Time { return now }
	b.update(1, 10)
	if buf.Len() != 0 {
		t.Fatalf("drawn in the first second: %q", buf.String())
	}
	now = now.Add(2 * time.Second)
	b.update(5, 10)
	b.update(12, 10) // retries after 409 pass the plan
	b.clear()
	if want := "\rprobing [###############...............] 5/10\rprobing [##############################] 12/12\r\033[K"; buf.String() != want {
		t.Errorf("drew %q, want %q", buf.String(), want)
	}
	buf.Reset()
	off := newProgressBar(&buf, false)
	off.now = func() time.Time { return now.Add(time.Hour) }
	off.update(5, 10)
	off.clear()
	if buf.Len() != 0 || isTerminal(&buf) {
		t.Errorf("drawn off a terminal: %q", buf.String())
	}
}

// TestProbeInsecure: a server whose certificate no authority signed is
// refused without -k and probed with it (and with -insecure).
func TestProbeInsecure(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var created atomic.Int64
	srv := httptest.NewTLSServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, created.Add(1))
	})))
	t.Cleanup(srv.Close)
	r := runIdem(t, "", "probe", "-d", `{"a":1,"b":2}`, srv.URL)
	if r.code != 1 || !strings.Contains(r.stderr, "certificate") || created.Load() != 0 {
		t.Fatalf("without -k: exit %d, stderr %q, %d created", r.code, r.stderr, created.Load())
	}
	for _, flag := range []string{"-k", "-insecure"} {
		before := created.Load()
		r = runIdem(t, "", "probe", flag, "-d", `{"a":1,"b":2}`, srv.URL)
		if r.code != 0 || created.Load()-before != 9 {
			t.Errorf("%s: exit %d, %d created; stdout:\n%s\nstderr:\n%s", flag, r.code, created.Load()-before, r.stdout, r.stderr)
		}
	}
}

// checkWidth fails the test for a line of out over 80 columns.
func checkWidth(t *testing.T, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("a line of %d columns: %q", n, line)
		}
	}
}

// renameMarker serves h with its Idempotent-Replayed header renamed
// X-Idempotent-Replayed: an API the draft's core holds, and the stripe
// profile does not.
func renameMarker(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&renamingWriter{ResponseWriter: w}, r)
	})
}

type renamingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *renamingWriter) WriteHeader(status int) {
	if !w.wrote {
		w.wrote = true
		if v := w.Header().Get("Idempotent-Replayed"); v != "" {
			w.Header().Del("Idempotent-Replayed")
			w.Header().Set("X-Idempotent-Replayed", v)
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *renamingWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// TestProbeProfiles: an API that marks replays X-Idempotent-Replayed
// holds the core and differs from the stripe profile: exit 0 with a note
// without -profile, 3 with -profile stripe (the failed check named), 0
// with -profile strict-keys; an unknown profile is a usage error.
func TestProbeProfiles(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var created atomic.Int64
	srv := httptest.NewServer(renameMarker(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, created.Add(1))
	}))))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		profile string
		code    int
		want    string
	}{
		{"", 0, "Note: the API differs from profile stripe (replay-marker)"},
		{"stripe", 3, "PROFILE FAIL: stripe (required): replay-marker"},
		{" strict-keys ", 0, "PROFILE strict-keys (required)"},
		{"stripe,strict-keys", 3, "PROFILE FAIL: stripe (required): replay-marker"},
		{"nope", 2, "-profile: \"nope\" is not a profile"},
	} {
		args := []string{"probe", "-d", `{"name":"pen"}`, srv.URL}
		if c.profile != "" {
			args = append(args, "-profile", c.profile)
		}
		r := runIdem(t, "", args...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("-profile %q: exit %d, want %d and %q; stdout:\n%s\nstderr: %s", c.profile, r.code, c.code, c.want, r.stdout, r.stderr)
		}
		if c.code != 2 && (!strings.Contains(r.stdout, "PASS: core passed") || !strings.Contains(r.stdout, "  fail    replay-marker ")) {
			t.Errorf("-profile %q: stdout:\n%s", c.profile, r.stdout)
		}
		checkWidth(t, r.stdout)
	}
	// -json: the same grades, and exit 3 under -profile stripe.
	r := runIdem(t, "", "probe", "-json", "-profile", "stripe", "-d", `{"name":"pen"}`, srv.URL)
	var rep probe.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 3 || !rep.CoreOK || rep.OK ||
		len(rep.Profiles) != len(probe.Profiles) || rep.Profiles[0].Name != "stripe" || !rep.Profiles[0].Required || rep.Profiles[0].OK ||
		!slices.Equal(rep.Profiles[0].Failed, []string{"replay-marker"}) || !rep.Profiles[1].OK || !rep.Profiles[2].OK || !rep.Profiles[3].OK {
		t.Errorf("-json -profile stripe: exit %d, %v, report %+v", r.code, err, rep)
	}
}
