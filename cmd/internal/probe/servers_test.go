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

// TestIdemhttpPasses probes idemhttp's middleware (on memstore) around a
// handler that counts what it creates: every check passes, and the count
// moved by the executions the answers show, check by check.
func TestIdemhttpPasses(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var created atomic.Int64
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Item string `json:"item"`
			Qty  int    `json:"qty"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Item == "refuse" {
			idemhttp.WriteProblem(w, http.StatusBadRequest, "REFUSED", "Refused", "no such item")
			return
		}
		n := created.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/items/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"item":%q,"qty":%d}`, n, in.Item, in.Qty)
	})
	mux := http.NewServeMux()
	mux.Handle("/api", mw.Handler(create))
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"data":{"created":%d}}`, created.Load())
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	cfg := fakeConfig(srv.URL)
	cfg.EffectPath = "data.created"
	rep := run(t, cfg)
	if failed, na := statuses(rep, probe.Fail), statuses(rep, probe.NotApplicable); len(failed)+len(na) != 0 {
		logReport(t, rep)
		t.Fatalf("failed %q, n/a %q; want every check to pass", failed, na)
	}
	if rep.Effect.After != created.Load() || rep.Effect.Expected != created.Load()-rep.Effect.Before || created.Load() != 8 {
		t.Errorf("effect %+v; the handler created %d, want 8", rep.Effect, created.Load())
	}
}

// idemhttpAPI serves the handler of TestIdemhttpPasses's kind (POST /api
// creates, a body with "refuse" is 400, GET /count counts) behind
// idemhttp's middleware with cfg (its Store set here), its answers passed
// through rewrite when not nil.
func idemhttpAPI(t *testing.T, cfg idemhttp.Config, rewrite func(h http.Header)) (string, *atomic.Int64) {
	t.Helper()
	cfg.Store = memstore.New(nil)
	mw, err := idemhttp.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	var created atomic.Int64
	var api http.Handler = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if body, _ := io.ReadAll(r.Body); strings.Contains(string(body), "refuse") {
			idemhttp.WriteProblem(w, http.StatusBadRequest, "REFUSED", "Refused", "no such item")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, created.Add(1))
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
// alternative the draft allows: replays marked under another name, not
// marked at all, a fingerprint over the raw body. Ground truth: each holds
// the core (CoreOK, every core check passes or warns) and fails exactly
// the stripe profile's check it departs from; the effect agrees.
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
	for _, c := range []struct {
		name    string
		cfg     idemhttp.Config
		rewrite func(h http.Header)
		failed  []string
		warned  []string // besides concurrent-409, which scheduling decides
	}{
		{"marker X-Idempotent-Replayed", idemhttp.Config{}, rename("X-Idempotent-Replayed"), []string{"replay-marker"}, nil},
		{"marker Idempotency-Replayed", idemhttp.Config{}, rename("Idempotency-Replayed"), []string{"replay-marker"}, nil},
		{"no marker", idemhttp.Config{}, rename(""), []string{"replay-marker"}, []string{"stored-4xx"}},
		{"raw-body fingerprint", idemhttp.Config{Fingerprint: raw}, nil, []string{"reordered-json"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			base, created := idemhttpAPI(t, c.cfg, c.rewrite)
			rep := run(t, fakeConfig(base))
			warned := slices.DeleteFunc(statuses(rep, probe.Warning), func(id string) bool { return id == "concurrent-409" })
			if failed, na := statuses(rep, probe.Fail), statuses(rep, probe.NotApplicable); !slices.Equal(failed, c.failed) ||
				len(na) != 0 || !slices.Equal(warned, c.warned) || !rep.CoreOK || !rep.OK {
				logReport(t, rep)
				t.Fatalf("failed %q, n/a %q, warned %q, core OK %v; want failed %q, warned %q, core OK", failed, na, warned, rep.CoreOK, c.failed, c.warned)
			}
			for _, r := range rep.Checks {
				if slices.Contains(c.failed, r.ID) && r.Grade != probe.Profile {
					t.Errorf("%s failed as %s; want a profile's check", r.ID, r.Grade)
				}
			}
			if rep.Effect.After != created.Load() || rep.Effect.Expected != created.Load() || created.Load() != 8 {
				t.Errorf("effect %+v; the handler created %d, want 8", rep.Effect, created.Load())
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
// /orders as the effect: every check passes.
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
			cfg := &probe.Config{
				URL:         base + "/orders",
				Header:      http.Header{"X-User-Id": {user}},
				Body:        []byte(`{"sku":"BOOK-1","quantity":1}`),
				RefusedBody: []byte(`{"sku":"NO-SUCH-SKU","quantity":1}`),
				EffectURL:   base + "/orders?limit=500",
				EffectPath:  "orders.#",
			}
			rep := run(t, cfg)
			if failed, na := statuses(rep, probe.Fail), statuses(rep, probe.NotApplicable); len(failed)+len(na) != 0 {
				logReport(t, rep)
				t.Fatalf("failed %q, n/a %q; want every check to pass", failed, na)
			}
			// The orders are there, once per key executed.
			if n := countOrders(t, base, user); rep.Effect.Before != 0 || int64(n) != rep.Effect.After || n != 8 {
				t.Errorf("the user has %d orders; the report read %+v; want 8", n, rep.Effect)
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
