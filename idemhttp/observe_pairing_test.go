package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/memstore"
)

// pairObserver checks that every Start gets exactly one End, with the
// same Kind and Op, from the context Start returned: the contract a
// tracer's spans depend on (a span never ended leaks; one ended twice is
// an error in the SDK).
type pairObserver struct {
	mu      sync.Mutex
	open    map[*pairToken]bool
	starts  int
	errs    []string
	instant int
}

type pairToken struct {
	kind  idem.Kind
	op    string
	ended bool
}

type pairKey struct{}

func newPairObserver() *pairObserver { return &pairObserver{open: map[*pairToken]bool{}} }

func (o *pairObserver) Start(ctx context.Context, e idem.Event) context.Context {
	tok := &pairToken{kind: e.Kind, op: e.Op}
	o.mu.Lock()
	o.open[tok] = true
	o.starts++
	o.mu.Unlock()
	return context.WithValue(ctx, pairKey{}, tok)
}

func (o *pairObserver) End(ctx context.Context, e idem.Event) {
	tok, _ := ctx.Value(pairKey{}).(*pairToken)
	o.mu.Lock()
	defer o.mu.Unlock()
	if tok == nil || tok.kind != e.Kind || tok.op != e.Op {
		// An instant, reported by End alone.
		switch e.Kind {
		case idem.KindLease, idem.KindSweep:
			o.instant++
		default:
			o.errs = append(o.errs, fmt.Sprintf("End of %s %q (outcome %q) without its Start", e.Kind, e.Op, e.Outcome))
		}
		return
	}
	if tok.ended {
		o.errs = append(o.errs, fmt.Sprintf("End of %s %q (outcome %q) twice", e.Kind, e.Op, e.Outcome))
		return
	}
	tok.ended = true
	delete(o.open, tok)
}

// check fails t if an operation was ended wrongly or is still open.
func (o *pairObserver) check(t *testing.T, name string) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.errs {
		t.Errorf("%s: %s", name, e)
	}
	for tok := range o.open {
		t.Errorf("%s: %s %q started and never ended", name, tok.kind, tok.op)
	}
	if o.starts == 0 {
		t.Errorf("%s: nothing was started", name)
	}
	o.errs, o.open, o.starts = nil, map[*pairToken]bool{}, 0
}

// TestObserverStartsAndEndsPair drives a guarded route through every
// path (each outcome, a handler that panics, a store down with and
// without FailOpen, a completion that fails, a lease lost, Wait mode and
// a client that leaves while waiting) under an observer that checks that
// each Start gets exactly one End.
func TestObserverStartsAndEndsPair(t *testing.T) {
	t.Parallel()
	obs := newPairObserver()
	store := &flakyStore{Store: memstore.New(nil)}
	var mode struct {
		sync.Mutex
		panics, lose bool
		status       int
		block        chan struct{}
		blocked      chan struct{}
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode.Lock()
		panics, lose, status, block, blocked := mode.panics, mode.lose, mode.status, mode.block, mode.blocked
		mode.Unlock()
		if lose {
			l := idemhttp.ExecutionFrom(r.Context()).Lease()
			if err := store.Store.Delete(context.Background(), l.Scope, l.Key); err != nil {
				t.Error(err)
			}
		}
		if block != nil {
			close(blocked)
			<-block
		}
		if panics {
			panic("handler failed")
		}
		if status == 0 {
			status = http.StatusCreated
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("done"))
	})
	newMux := func(cfg idemhttp.Config) *http.ServeMux {
		cfg.Store, cfg.Observer, cfg.StoreName = store, obs, "memory"
		mw, err := idemhttp.New(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /orders/{id}", mw.Handler(handler))
		return mux
	}
	plain := newMux(idemhttp.Config{MaxRequestBody: 64})
	failOpen := newMux(idemhttp.Config{FailOpen: true})
	wait := newMux(idemhttp.Config{Wait: 10 * time.Second})
	do := func(mux *http.ServeMux, r *http.Request) (code int) {
		defer func() {
			if p := recover(); p != nil {
				code = -1
			}
		}()
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	req := func(key, body string) *http.Request { return request(http.MethodPost, "/orders/1", key, body) }
	set := func(f func()) {
		mode.Lock()
		defer mode.Unlock()
		mode.panics, mode.lose, mode.status, mode.block, mode.blocked = false, false, 0, nil, nil
		f()
	}
	expect := func(name string, got, want int) {
		t.Helper()
		if got != want {
			t.Errorf("%s: status %d, want %d", name, got, want)
		}
		obs.check(t, name)
	}

	expect("executed", do(plain, req("k1", `{"a":1}`)), http.StatusCreated)
	expect("replayed", do(plain, req("k1", `{"a":1}`)), http.StatusCreated)
	expect("mismatch", do(plain, req("k1", `{"a":2}`)), http.StatusUnprocessableEntity)
	expect("missing key", do(plain, req("", `{"a":1}`)), http.StatusBadRequest)
	expect("too large", do(plain, req("k2", `{"a":"`+string(make([]byte, 100))+`"}`)), http.StatusRequestEntityTooLarge)
	set(func() { mode.status = http.StatusInternalServerError })
	expect("released", do(plain, req("k3", `{}`)), http.StatusInternalServerError)
	set(func() { mode.panics = true })
	expect("handler panicked", do(plain, req("k4", `{}`)), -1)
	set(func() { mode.lose = true })
	do(plain, req("k5", `{}`))
	obs.check(t, "lease lost")
	set(func() {})

	store.acquire.Store(true)
	expect("store down", do(plain, req("k6", `{}`)), http.StatusServiceUnavailable)
	expect("store down, fail open", do(failOpen, req("k6", `{}`)), http.StatusCreated)
	store.acquire.Store(false)
	store.complete.Store(true)
	do(plain, req("k7", `{}`))
	obs.check(t, "completion failed")
	store.complete.Store(false)

	// Wait: a retry waits for the first execution, then replays it; a
	// retry whose client leaves while it waits.
	block, blocked := make(chan struct{}), make(chan struct{})
	set(func() { mode.block, mode.blocked = block, blocked })
	first := make(chan int)
	go func() { first <- do(wait, req("k8", `{}`)) }()
	<-blocked
	set(func() {})
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan int)
	go func() { gone <- do(wait, req("k8", `{}`).WithContext(ctx)) }()
	waiting := make(chan int)
	go func() { waiting <- do(wait, req("k8", `{}`)) }()
	cancel()
	<-gone
	close(block)
	if c := <-first; c != http.StatusCreated {
		t.Errorf("wait: first status %d", c)
	}
	if c := <-waiting; c != http.StatusCreated {
		t.Errorf("wait: the waiting retry's status %d", c)
	}
	obs.check(t, "wait")
}

// TestObserverNilStart: an Observer whose Start returns nil (taken for the
// request's context) does not break the request: it executes, is stored,
// and is reported.
func TestObserverNilStart(t *testing.T) {
	t.Parallel()
	obs := &obstest.NilStart{}
	st := memstore.New(nil)
	mw, err := idemhttp.New(&idemhttp.Config{Store: st, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, request(http.MethodPost, "/orders", "k1", "{}"))
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	rec, err := st.Get(context.Background(), "", "k1")
	if err != nil || rec.Status != idem.StatusCompleted {
		t.Fatalf("record %+v, %v; want completed", rec, err)
	}
	if obs.Ends() < 3 { // the request, its Acquire and its Complete
		t.Fatalf("%d ends reported, want at least 3", obs.Ends())
	}
}
