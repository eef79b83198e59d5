package exactlyonce

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
)

// failureRig is sqlstore on PostgreSQL reached through a proxy the test
// controls, and a handler whose effect (a row) commits with the stored
// response (CompleteTx).
type failureRig struct {
	t      *testing.T
	proxy  *netfault.Proxy
	direct *sql.DB // to PostgreSQL, not through the proxy: to inspect
	h      http.Handler
	run    string
	calls  atomic.Int64
	// plain makes the handler commit its effect alone and leave the
	// completion to the middleware (no CompleteTx).
	plain bool
	// hook, when set, runs inside the handler: before its transaction
	// (where == "before") or after its commit (where == "after").
	hook func(where string)
}

const rigLease = time.Second

func newFailureRig(t *testing.T, opts ...func(*idemhttp.Config)) *failureRig {
	pg := testenv.Postgres.Need(t)
	ctx := context.Background()
	proxy, err := netfault.New(hostOf(t, pg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	u, _ := url.Parse(pg)
	u.Host = proxy.Addr()
	viaProxy, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })
	direct, err := sql.Open("pgx", pg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	if _, err := direct.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idem_fail_effects (
		id bigserial PRIMARY KEY, run text NOT NULL, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := sqlstore.New(viaProxy, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	r := &failureRig{t: t, proxy: proxy, direct: direct, run: fmt.Sprintf("fail-%d", time.Now().UnixNano())}
	cfg := &idemhttp.Config{
		Store:        store,
		Lease:        rigLease,
		StoreTimeout: 300 * time.Millisecond,
		Scope:        func(*http.Request) (string, error) { return r.run, nil },
	}
	for _, o := range opts {
		o(cfg)
	}
	mw, err := idemhttp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.h = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.calls.Add(1)
		ctx := req.Context()
		key := req.Header.Get("Idempotency-Key")
		if r.hook != nil {
			r.hook("before")
		}
		fail := func(err error) { http.Error(w, err.Error(), http.StatusInternalServerError) }
		// The handler bounds its own transaction, as a handler should.
		ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		tx, err := viaProxy.BeginTx(ctx, nil)
		if err != nil {
			fail(err)
			return
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO idem_fail_effects (run, key) VALUES ($1, $2)`, r.run, key); err != nil {
			fail(err)
			return
		}
		resp, _ := idemhttp.JSONResponse(http.StatusCreated, map[string]string{"key": key, "n": fmt.Sprint(r.calls.Load())})
		if !r.plain {
			if err := idemhttp.ExecutionFrom(ctx).CompleteTx(ctx, tx, resp); err != nil {
				fail(err)
				return
			}
		}
		if r.hook != nil {
			r.hook("commit")
		}
		if err := tx.Commit(); err != nil {
			fail(err)
			return
		}
		if r.hook != nil {
			r.hook("after")
		}
		idemhttp.WriteResponse(w, resp)
	}))
	return r
}

func hostOf(t *testing.T, pgURL string) string {
	u, err := url.Parse(pgURL)
	if err != nil || u.Host == "" {
		t.Fatalf("cannot read host:port from %s", testenv.Postgres.Var)
	}
	return u.Host
}

func (r *failureRig) post(key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	r.h.ServeHTTP(w, req)
	return w
}

// down makes PostgreSQL unreachable through the proxy: new connections
// are refused and open ones dropped.
func (r *failureRig) down() { r.proxy.Refuse(true); r.proxy.Drop() }
func (r *failureRig) up()   { r.proxy.Refuse(false) }

func (r *failureRig) effects(key string) int {
	r.t.Helper()
	var n int
	if err := r.direct.QueryRow(`SELECT count(*) FROM idem_fail_effects WHERE run = $1 AND key = $2`, r.run, key).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *failureRig) status(key string) string {
	r.t.Helper()
	var s string
	err := r.direct.QueryRow(`SELECT status FROM idem_records WHERE scope = $1 AND idempotency_key = $2`, r.run, key).Scan(&s)
	if err == sql.ErrNoRows {
		return "none"
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

func problem(w *httptest.ResponseRecorder) string {
	var p struct{ Code string }
	json.Unmarshal(w.Body.Bytes(), &p)
	return p.Code
}

// Connection refused before execution: 503 STORE_UNAVAILABLE with
// Retry-After, the handler does not run; once the store is back the retry
// runs once.
func TestStoreRefusedBeforeExecution(t *testing.T) {
	r := newFailureRig(t)
	r.down()
	w := r.post("k1")
	if w.Code != http.StatusServiceUnavailable || problem(w) != "STORE_UNAVAILABLE" || w.Header().Get("Retry-After") == "" {
		t.Fatalf("store down: %d %s %v", w.Code, w.Body, w.Header())
	}
	if r.calls.Load() != 0 || r.effects("k1") != 0 {
		t.Fatalf("the handler ran %d times with the store down", r.calls.Load())
	}
	r.up()
	if w := r.post("k1"); w.Code != http.StatusCreated {
		t.Fatalf("after the store came back: %d %s", w.Code, w.Body)
	}
	if w := r.post("k1"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v", w.Code, w.Header())
	}
	if n := r.effects("k1"); n != 1 || r.calls.Load() != 1 {
		t.Fatalf("%d effects, %d runs; want 1, 1", n, r.calls.Load())
	}
}

// The connection drops after Acquire, before the effect: the client gets
// the handler's real answer (500), the record is left to its lease, and
// after the lease a retry runs once.
func TestStoreDroppedAfterAcquire(t *testing.T) {
	r := newFailureRig(t)
	r.hook = func(where string) {
		if where == "before" && r.calls.Load() == 1 {
			r.down()
		}
	}
	w := r.post("k2")
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("first: %d %s; want the handler's 500", w.Code, w.Body)
	}
	if s := r.status("k2"); s != "processing" {
		t.Fatalf("record is %s; want processing, left to its lease", s)
	}
	r.up()
	if w := r.post("k2"); w.Code != http.StatusConflict || problem(w) != "PROCESSING" {
		t.Fatalf("retry within the lease: %d %s", w.Code, w.Body)
	}
	time.Sleep(rigLease + 200*time.Millisecond)
	if w := r.post("k2"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the lease: %d %s", w.Code, w.Body)
	}
	if n := r.effects("k2"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// The connection drops after the effect and its completion committed, before
// the middleware could confirm it: the client still gets the real 201, and
// a retry replays it; the effect happened once.
func TestStoreDroppedAfterCommit(t *testing.T) {
	r := newFailureRig(t)
	r.hook = func(where string) {
		if where == "after" && r.calls.Load() == 1 {
			r.down()
		}
	}
	w := r.post("k3")
	if w.Code != http.StatusCreated {
		t.Fatalf("first: %d %s; want the real 201", w.Code, w.Body)
	}
	first := w.Body.String()
	if s := r.status("k3"); s != "completed" {
		t.Fatalf("record is %s; want completed (it committed with the effect)", s)
	}
	r.up()
	w = r.post("k3")
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != first {
		t.Fatalf("retry: %d %s %v; want the replay of %s", w.Code, w.Body, w.Header(), first)
	}
	if n := r.effects("k3"); n != 1 || r.calls.Load() != 1 {
		t.Fatalf("%d effects, %d runs; want 1, 1", n, r.calls.Load())
	}
}

// The store stalls while the effect and its completion commit: the commit
// times out in the handler, the middleware's check of the outcome times out
// (StoreTimeout), and the client gets the handler's real answer instead of
// hanging. Whether the stalled COMMIT reached the database or not, retries
// end with exactly one effect and one definite 201.
func TestStoreStallsOnCommit(t *testing.T) {
	r := newFailureRig(t)
	r.hook = func(where string) {
		if where == "commit" && r.calls.Load() == 1 {
			r.proxy.Stall()
		}
	}
	w := r.post("k4")
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("first: %d %s; want the handler's 500 after its commit timed out", w.Code, w.Body)
	}
	r.proxy.Resume()
	deadline := time.Now().Add(rigLease + 3*time.Second)
	for {
		w = r.post("k4")
		if w.Code == http.StatusCreated {
			break
		}
		if w.Code != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("retry: %d %s", w.Code, w.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if w := r.post("k4"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("final retry: %d %v; want a replay", w.Code, w.Header())
	}
	if n := r.effects("k4"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	t.Logf("the handler ran %d times", r.calls.Load())
}

// The store stalls when the middleware completes a record after the
// handler's effect committed on its own (no CompleteTx), and stays
// stalled longer than the completion is retried (here: not at all,
// CompleteRetry < 0): the completion times out (StoreTimeout), the client
// still gets the handler's real 201, and the record is left processing to
// its lease, so a retry within the lease gets 409 and the effect is not
// run again. (After the lease a retry runs the handler again: an effect
// outside the record's transaction must be idempotent itself; that is
// why the shop uses CompleteTx.)
func TestStoreStallsOnComplete(t *testing.T) {
	r := newFailureRig(t, func(c *idemhttp.Config) { c.CompleteRetry = -1 })
	r.plain = true
	r.hook = func(where string) {
		if where == "after" && r.calls.Load() == 1 {
			r.proxy.Stall()
		}
	}
	w := r.post("k5")
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %s; want the handler's real 201", w.Code, w.Body)
	}
	if s := r.status("k5"); s != "processing" {
		t.Fatalf("record is %s; want processing, left to its lease", s)
	}
	r.proxy.Resume()
	if w := r.post("k5"); w.Code != http.StatusConflict || problem(w) != "PROCESSING" {
		t.Fatalf("retry within the lease: %d %s; want 409 PROCESSING", w.Code, w.Body)
	}
	if n := r.effects("k5"); n != 1 || r.calls.Load() != 1 {
		t.Fatalf("%d effects, %d runs; want 1, 1", n, r.calls.Load())
	}
}

// The store stalls for a moment (less than CompleteRetry) when the
// middleware completes the record: the completion is tried again until
// the store answers, and only then does the client get its 201. The
// record is completed, a retry replays it, and the effect ran once.
func TestStoreStallsBrieflyOnComplete(t *testing.T) {
	r := newFailureRig(t)
	r.plain = true
	stalled := make(chan struct{})
	r.hook = func(where string) {
		if where == "after" && r.calls.Load() == 1 {
			r.proxy.Stall()
			close(stalled)
		}
	}
	go func() {
		<-stalled
		time.Sleep(700 * time.Millisecond) // over two StoreTimeouts, under CompleteRetry
		r.proxy.Resume()
	}()
	w := r.post("k6")
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %s; want the handler's real 201", w.Code, w.Body)
	}
	if s := r.status("k6"); s != "completed" {
		t.Fatalf("record is %s; want completed once the store answered again", s)
	}
	if w := r.post("k6"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s; want the 201 replayed", w.Code, w.Body)
	}
	if n := r.effects("k6"); n != 1 || r.calls.Load() != 1 {
		t.Fatalf("%d effects, %d runs; want 1, 1", n, r.calls.Load())
	}
}
