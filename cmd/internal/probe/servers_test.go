package probe_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/probe"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/memstore"
)

// byUser scopes idemhttp's keys to the X-User header (the fake's and
// fakeConfig's caller).
func byUser(r *http.Request) (string, error) { return "user:" + r.Header.Get("X-User"), nil }

// TestIdemhttpPasses probes idemhttp's middleware (on memstore, keys
// scoped to the caller, a retention of 3 s) around a handler that counts
// what it creates, sets a session cookie and fails a body with "fail":
// every check passes (the two that depend on a duplicate arriving in
// flight pass or warn as it comes), and the count moved by the
// executions the answers show, check by check.
func TestIdemhttpPasses(t *testing.T) {
	t.Parallel()
	const retention = 3 * time.Second
	base, created := idemhttpAPI(t, idemhttp.Config{Scope: byUser, Retention: retention}, nil)
	cfg := fakeConfig(base)
	cfg.Retention = retention
	rep := run(t, cfg)
	if failed, na := statuses(rep, probe.Fail), slices.DeleteFunc(statuses(rep, probe.NotApplicable), func(id string) bool { return id == "retry-after" }); len(failed)+len(na) != 0 {
		logReport(t, rep)
		t.Fatalf("failed %q, n/a %q; want every check to pass", failed, na)
	}
	// 13 executions of the first caller (the expiry check's two among
	// them), 2 of the second: the count is every caller's.
	if rep.Effect.After != created.Load() || rep.Effect.Expected != created.Load()-rep.Effect.Before || created.Load() != 15 {
		logReport(t, rep)
		t.Errorf("effect %+v; the handler created %d, want 15", rep.Effect, created.Load())
	}
}

// idemhttpAPI serves a handler behind idemhttp's middleware with cfg (its
// Store set here): POST /api creates an item (201 {"id": n} with a session
// cookie of its own, after 20 ms so that duplicates come in flight), a
// body with "refuse" is 400, one with "fail" 500; GET /count counts. Its
// answers pass through rewrite when not nil.
func idemhttpAPI(t *testing.T, cfg idemhttp.Config, rewrite func(h http.Header)) (string, *atomic.Int64) {
	t.Helper()
	cfg.Store = memstore.New(nil)
	mw, err := idemhttp.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	var created atomic.Int64
	var api http.Handler = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(body), "refuse"):
			idemhttp.WriteProblem(w, http.StatusBadRequest, "REFUSED", "Refused", "no such item")
			return
		case strings.Contains(string(body), "fail"):
			idemhttp.WriteProblem(w, http.StatusBadGateway, "UPSTREAM", "Upstream failed", "the provider did not answer")
			return
		}
		time.Sleep(20 * time.Millisecond)
		n := created.Add(1)
		http.SetCookie(w, &http.Cookie{Name: "session", Value: fmt.Sprintf("s%d-%s", n, r.Header.Get("X-User")), HttpOnly: true})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/items/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n)
	}))
	if rewrite != nil {
		inner := api
		api = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec := httptest.NewRecorder()
			inner.ServeHTTP(rec, r)
			rewrite(rec.Header())
			maps.Copy(w.Header(), rec.Header())
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
		})
	}
	mux := http.NewServeMux()
	mux.Handle("POST /api", api)
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"count":%d}`, created.Load())
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, &created
}

// TestIdemhttpAlternatives probes idemhttp's middleware made to follow an
// alternative the draft allows (replays marked under another name, not
// marked at all, a fingerprint over the raw body, 5xx kept as Stripe
// keeps them), and misconfigured (no Scope: one key space for every
// caller). Ground truth: each alternative holds the core (CoreOK, every
// core check passes or warns) and fails exactly the profile's check it
// departs from; the misconfiguration fails the core's scoped-keys. The
// effect agrees.
func TestIdemhttpAlternatives(t *testing.T) {
	t.Parallel()
	rename := func(to string) func(h http.Header) {
		return func(h http.Header) {
			if v := h.Get(probe.ReplayedHeader); v != "" {
				h.Del(probe.ReplayedHeader)
				if to != "" {
					h.Set(to, v)
				}
			}
		}
	}
	raw := func(r *http.Request, body []byte) (idem.Fingerprint, error) {
		sum := sha256.Sum256(append([]byte(r.Method+" "+r.URL.Path+"\n"), body...))
		return idem.Fingerprint(hex.EncodeToString(sum[:])), nil
	}
	keep5xx := func(s int) bool { return s < 500 && idemhttp.DefaultRelease(s) }
	for _, c := range []struct {
		name    string
		cfg     idemhttp.Config
		rewrite func(h http.Header)
		coreOK  bool
		failed  []string
		warned  []string
		created int64 // the handler's executions
	}{
		{"marker X-Idempotent-Replayed", idemhttp.Config{Scope: byUser}, rename("X-Idempotent-Replayed"), true, []string{"replay-marker"}, nil, 13},
		{"marker Idempotency-Replayed", idemhttp.Config{Scope: byUser}, rename("Idempotency-Replayed"), true, []string{"replay-marker"}, nil, 13},
		{"no marker", idemhttp.Config{Scope: byUser}, rename(""), true, []string{"replay-marker"}, []string{"stored-4xx"}, 13},
		{"raw-body fingerprint", idemhttp.Config{Scope: byUser, Fingerprint: raw}, nil, true, []string{"reordered-json"}, nil, 13},
		{"5xx kept", idemhttp.Config{Scope: byUser, Release: keep5xx}, nil, true, []string{"released-5xx"}, nil, 12},
		{"no scope", idemhttp.Config{}, nil, false, []string{"scoped-keys"}, nil, 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			base, created := idemhttpAPI(t, c.cfg, c.rewrite)
			rep := run(t, fakeConfig(base))
			notScheduled := func(id string) bool { return slices.Contains(scheduled, id) }
			warned := slices.DeleteFunc(statuses(rep, probe.Warning), notScheduled)
			na := slices.DeleteFunc(statuses(rep, probe.NotApplicable), notScheduled)
			if failed := statuses(rep, probe.Fail); !slices.Equal(failed, c.failed) || !slices.Equal(na, []string{"expiry"}) ||
				!slices.Equal(warned, c.warned) || rep.CoreOK != c.coreOK || rep.OK != c.coreOK {
				logReport(t, rep)
				t.Fatalf("failed %q, n/a %q, warned %q, core OK %v; want failed %q, warned %q, core OK %v", failed, na, warned, rep.CoreOK, c.failed, c.warned, c.coreOK)
			}
			for _, r := range rep.Checks {
				if slices.Contains(c.failed, r.ID) && (r.Grade == probe.Core) != !c.coreOK {
					t.Errorf("%s failed as %s", r.ID, r.Grade)
				}
			}
			if rep.Effect.After != created.Load() || rep.Effect.Expected != created.Load() || created.Load() != c.created {
				logReport(t, rep)
				t.Errorf("effect %+v; the handler created %d, want %d", rep.Effect, created.Load(), c.created)
			}
		})
	}
}

// TestIdemhttpReleasedRefusal: a -d4xx body that idemhttp's middleware
// rightly does not store (a refusal of the credentials, which it
// releases, or a 4xx with Retry-After) fails the stored-4xx check with a
// reason that asks for another body. It used to fail it as a refusal
// "not stored (the request ran again)", blaming the API.
func TestIdemhttpReleasedRefusal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status     int
		retryAfter bool
	}{
		{http.StatusUnauthorized, false},
		{http.StatusForbidden, false},
		{http.StatusProxyAuthRequired, false},
		{http.StatusUnprocessableEntity, true},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			t.Parallel()
			mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if body, _ := io.ReadAll(r.Body); strings.Contains(string(body), "refuse") {
					if tc.retryAfter {
						w.Header().Set("Retry-After", "1")
					}
					idemhttp.WriteProblem(w, tc.status, "REFUSED", "Refused", "not now")
					return
				}
				w.WriteHeader(http.StatusCreated)
			})))
			t.Cleanup(srv.Close)
			cfg := fakeConfig(srv.URL)
			cfg.EffectURL, cfg.EffectPath = "", ""
			rep := run(t, cfg)
			for _, r := range rep.Checks {
				if r.ID == "stored-4xx" && (r.Status != probe.Fail || !strings.Contains(r.Reason, "give -d4xx a body the API refuses for good")) {
					t.Fatalf("stored-4xx: %s %q; want a failure that asks for another -d4xx body", r.Status, r.Reason)
				}
			}
		})
	}
}

// TestShopdPasses probes shopd's POST /orders on each backend, with GET
// /orders as the effect and a second user: every check that applies
// passes.
func TestShopdPasses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"sqlite", func(t *testing.T) []string { return []string{"-data", t.TempDir()} }},
		{"postgres", func(t *testing.T) []string {
			_, dsn := testdb.Postgres(t)
			return []string{"-db", dsn}
		}},
		{"mysql", func(t *testing.T) []string {
			_, dsn := testdb.MySQL(t)
			return []string{"-db", "mysql:" + dsn}
		}},
		{"redis+postgres", func(t *testing.T) []string {
			addr := testenv.Redis.Need(t)
			if !strings.Contains(addr, "://") {
				addr = "redis://" + addr + "/0"
			}
			_, dsn := testdb.Postgres(t)
			return []string{"-db", dsn, "-redis", addr}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append(c.args(t), "-nats-store", filepath.Join(t.TempDir(), "nats"))
			base := runShopd(t, args...)
			// A user of the run's own: Redis is shared between runs.
			user := strconv.FormatInt(rand.Int64N(1<<50)+1, 10)
			other := strconv.FormatInt(rand.Int64N(1<<50)+1, 10)
			cfg := &probe.Config{
				URL:         base + "/orders",
				Header:      http.Header{"X-User-Id": {user}},
				OtherHeader: http.Header{"X-User-Id": {other}},
				KeyRequired: true,
				Body:        []byte(`{"sku":"BOOK-1","quantity":1}`),
				RefusedBody: []byte(`{"sku":"NO-SUCH-SKU","quantity":1}`),
				EffectURL:   base + "/orders?limit=500",
				EffectPath:  "orders.#",
			}
			rep := run(t, cfg)
			// Not applicable: shopd has no order that fails with a 5xx,
			// sets no cookie on the API, and keeps keys a day; and a
			// duplicate may not come in flight.
			if failed, na := statuses(rep, probe.Fail), statuses(rep, probe.NotApplicable); len(failed) != 0 ||
				!slices.Equal(slices.DeleteFunc(na, func(id string) bool { return id == "retry-after" }), []string{"expiry", "private-headers", "released-5xx"}) {
				logReport(t, rep)
				t.Fatalf("failed %q, n/a %q; want every other check to pass", failed, na)
			}
			// The orders are there, once per execution: the second
			// caller's are its own. The other body of concurrent-mismatch
			// is an order too when it wins the race.
			executions := 0
			for _, r := range rep.Checks {
				if r.ID != "effect" {
					executions += r.Executions
				}
			}
			if n := countOrders(t, base, user); rep.Effect.Before != 0 || int64(n) != rep.Effect.After || n != executions || n < 9 || n > 10 {
				t.Errorf("the user has %d orders; the report read %+v, its checks %d executions; want 9 or 10", n, rep.Effect, executions)
			}
			if n := countOrders(t, base, other); n != 2 {
				t.Errorf("the second user has %d orders, want 2", n)
			}
		})
	}
}

func countOrders(t *testing.T, base, user string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/orders?limit=500", nil)
	req.Header.Set("X-User-ID", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Orders []json.RawMessage `json:"orders"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return len(out.Orders)
}

// runShopd runs shopd (shop.Run) on a free loopback port with args until
// the test ends, and returns its base URL.
func runShopd(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr obstest.LogBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- shop.Run(ctx, append([]string{"-addr", "127.0.0.1:0", "-log-level", "warn"}, args...), &stdout, &stderr)
	}()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("shopd: %v", err)
		}
		if t.Failed() {
			t.Logf("shopd's stderr:\n%s", stderr.String())
		}
	})
	listening := regexp.MustCompile(`shopd listening on (\S+)`)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := listening.FindStringSubmatch(stdout.String()); m != nil {
			return "http://" + strings.TrimPrefix(m[1], "http://")
		}
		select {
		case err := <-done:
			t.Fatalf("shopd ended before listening: %v; stderr:\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("shopd did not listen within 60 s; stderr:\n%s", stderr.String())
		}
	}
}

var _ io.Writer = (*obstest.LogBuffer)(nil)
