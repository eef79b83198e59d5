package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/memstore"
)

// recObserver records every event it is told, and marks the context
// Start returns so that nested operations can be told from top-level ones.
type recObserver struct {
	mu     sync.Mutex
	events []recEvent
}

type recEvent struct {
	idem.Event
	start  bool
	parent idem.Kind // the Kind of the operation whose Start made ctx, 0 if none
}

type parentKey struct{}

func (o *recObserver) Start(ctx context.Context, e idem.Event) context.Context {
	o.add(ctx, e, true)
	return context.WithValue(ctx, parentKey{}, e.Kind)
}

func (o *recObserver) End(ctx context.Context, e idem.Event) { o.add(ctx, e, false) }

func (o *recObserver) add(ctx context.Context, e idem.Event, start bool) {
	p, _ := ctx.Value(parentKey{}).(idem.Kind)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, recEvent{Event: e, start: start, parent: p})
}

// take returns the events recorded and forgets them.
func (o *recObserver) take() []recEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	ev := o.events
	o.events = nil
	return ev
}

// requestEnds returns the outcomes of the KindRequest ends among ev.
func requestEnds(ev []recEvent) []idem.Event {
	var out []idem.Event
	for _, e := range ev {
		if e.Kind == idem.KindRequest && !e.start {
			out = append(out, e.Event)
		}
	}
	return out
}

// TestObserverOutcomes drives each outcome through a ServeMux route and
// checks the one KindRequest Start/End pair of each request: its route
// is the mux's pattern (not the path, which holds an id), its outcome,
// and that its store calls are reported as its children.
func TestObserverOutcomes(t *testing.T) {
	t.Parallel()
	obs := &recObserver{}
	store := &flakyStore{Store: memstore.New(nil)}
	var mode struct {
		sync.Mutex
		loseLease bool
		status    int
		block     chan struct{}
		blocked   chan struct{}
	}
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, Observer: obs, StoreName: "memory", MaxRequestBody: 64})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode.Lock()
		lose, status, block, blocked := mode.loseLease, mode.status, mode.block, mode.blocked
		mode.Unlock()
		if lose {
			l := idemhttp.ExecutionFrom(r.Context()).Lease()
			if err := store.Delete(context.Background(), l.Scope, l.Key); err != nil {
				t.Error(err)
			}
		}
		if block != nil {
			close(blocked)
			<-block
		}
		if status == 0 {
			status = http.StatusCreated
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("done"))
	})))
	do := func(key, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, request(http.MethodPost, "/orders/12345", key, body))
		return w
	}
	check := func(name string, w *httptest.ResponseRecorder, status int, outcome string, storeOps ...string) {
		t.Helper()
		if w.Code != status {
			t.Fatalf("%s: status %d, want %d: %s", name, w.Code, status, w.Body)
		}
		ev := obs.take()
		ends := requestEnds(ev)
		if len(ends) != 1 || ends[0].Outcome != outcome || ends[0].Route != "POST /orders/{id}" || ends[0].Store != "memory" {
			t.Fatalf("%s: request ends %+v, want one %s on POST /orders/{id}", name, ends, outcome)
		}
		if ends[0].Duration <= 0 {
			t.Errorf("%s: duration %v", name, ends[0].Duration)
		}
		if ev[0].Kind != idem.KindRequest || !ev[0].start || ev[0].Route != "POST /orders/{id}" {
			t.Errorf("%s: first event %+v, want the request's Start", name, ev[0])
		}
		var ops []string
		for _, e := range ev {
			if e.Kind != idem.KindStore {
				continue
			}
			if e.start {
				if e.parent != idem.KindRequest {
					t.Errorf("%s: store %s started outside the request's context", name, e.Op)
				}
				continue
			}
			ops = append(ops, e.Op)
			if e.parent != idem.KindStore {
				t.Errorf("%s: store %s ended outside the context its Start returned", name, e.Op)
			}
			if e.Store != "memory" || e.KeyHash == "" || e.Duration <= 0 {
				t.Errorf("%s: store event %+v", name, e.Event)
			}
		}
		if strings.Join(ops, ",") != strings.Join(storeOps, ",") {
			t.Errorf("%s: store calls %v, want %v", name, ops, storeOps)
		}
	}

	check("executed", do("k1", `{}`), http.StatusCreated, idem.OutcomeExecuted, idem.OpAcquire, idem.OpComplete)
	check("replayed", do("k1", `{}`), http.StatusCreated, idem.OutcomeReplayed, idem.OpAcquire)
	check("mismatch", do("k1", `{"a":1}`), http.StatusUnprocessableEntity, idem.OutcomeMismatch, idem.OpAcquire)
	check("missing key", do("", `{}`), http.StatusBadRequest, idem.OutcomeMissingKey)
	check("invalid key", do("bad\x01key", `{}`), http.StatusBadRequest, idem.OutcomeInvalidKey)
	check("too large", do("k2", `{"pad":"`+strings.Repeat("x", 100)+`"}`), http.StatusRequestEntityTooLarge, idem.OutcomeTooLarge)

	mode.Lock()
	mode.status = http.StatusInternalServerError
	mode.Unlock()
	check("released", do("k3", `{}`), http.StatusInternalServerError, idem.OutcomeReleased, idem.OpAcquire, idem.OpRelease)
	mode.Lock()
	mode.status = 0
	mode.loseLease = true
	mode.Unlock()
	check("lease lost", do("k4", `{}`), http.StatusConflict, idem.OutcomeLeaseLost, idem.OpAcquire, idem.OpComplete, idem.OpGet)
	mode.Lock()
	mode.loseLease = false
	mode.Unlock()

	store.acquire.Store(true)
	check("store error", do("k5", `{}`), http.StatusServiceUnavailable, idem.OutcomeStoreError, idem.OpAcquire)
	store.acquire.Store(false)

	// In flight: a second request while the first one's handler runs.
	mode.Lock()
	mode.block, mode.blocked = make(chan struct{}), make(chan struct{})
	block, blocked := mode.block, mode.blocked
	mode.Unlock()
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- do("k6", `{}`) }()
	<-blocked
	obs.take() // the first request's Start and Acquire
	mode.Lock()
	mode.block = nil
	mode.Unlock()
	check("in flight", do("k6", `{}`), http.StatusConflict, idem.OutcomeInFlight, idem.OpAcquire)
	close(block)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if ends := requestEnds(obs.take()); len(ends) != 1 || ends[0].Outcome != idem.OutcomeExecuted {
		t.Fatalf("first request: %+v", ends)
	}

	// A request whose method is not guarded is not reported.
	w := httptest.NewRecorder()
	mw.Handler(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/orders/1", nil))
	if ev := obs.take(); len(ev) != 0 {
		t.Errorf("GET reported: %+v", ev)
	}
}

// TestObserverRouteFunc: Config.Route names the route when set; a
// middleware that wraps the whole mux sees no pattern and reports "".
func TestObserverRouteFunc(t *testing.T) {
	t.Parallel()
	obs := &recObserver{}
	for _, tc := range []struct {
		route func(*http.Request) string
		want  string
	}{{nil, ""}, {func(*http.Request) string { return "orders" }, "orders"}} {
		mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil), Observer: obs, Route: tc.route})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("POST /orders/{id}", echoHandler)
		w := httptest.NewRecorder()
		mw.Handler(mux).ServeHTTP(w, request(http.MethodPost, "/orders/98765", "k", `{}`))
		ends := requestEnds(obs.take())
		if w.Code != http.StatusCreated || len(ends) != 1 || ends[0].Route != tc.want || ends[0].Outcome != idem.OutcomeExecuted || ends[0].Store != idem.DefaultStoreName {
			t.Fatalf("status %d, ends %+v; want route %q", w.Code, ends, tc.want)
		}
	}
}

// TestObserverLease: the watchdog reports renewals, and the lease lost
// when the store refuses a renewal, in the execution's context.
func TestObserverLease(t *testing.T) {
	t.Parallel()
	obs := &recObserver{}
	store := memstore.New(nil)
	renewed := make(chan struct{})
	var once sync.Once
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, Observer: obs, Lease: renewedLease,
		Release: func(int) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Wait for a renewal, then take the record away: the next renewal
		// is refused and the context ends for a lost lease.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if hasLease(obs, idem.OutcomeRenewed) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		once.Do(func() { close(renewed) })
		if !hasLease(obs, idem.OutcomeRenewed) {
			t.Error("no renewal reported")
		}
		l := idemhttp.ExecutionFrom(r.Context()).Lease()
		if err := store.Delete(context.Background(), l.Scope, l.Key); err != nil {
			t.Error(err)
		}
		<-r.Context().Done()
		w.WriteHeader(http.StatusCreated)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, request(http.MethodPost, "/x", "k", `{}`))
	<-renewed
	if w.Code != http.StatusConflict {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	ev := obs.take()
	var lost int
	for _, e := range ev {
		if e.Kind == idem.KindLease && e.Outcome == idem.OutcomeLost {
			lost++
			if e.parent != idem.KindRequest || e.KeyHash != idem.HashKey("", "k") {
				t.Errorf("lease lost event %+v (parent %v)", e.Event, e.parent)
			}
		}
	}
	if lost != 1 {
		t.Errorf("%d lease lost events, want 1: %+v", lost, ev)
	}
	if ends := requestEnds(ev); len(ends) != 1 || ends[0].Outcome != idem.OutcomeLeaseLost {
		t.Errorf("request ends %+v", ends)
	}
}

func hasLease(o *recObserver, outcome string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.events {
		if e.Kind == idem.KindLease && e.Outcome == outcome {
			return true
		}
	}
	return false
}

// TestLogsHashKeys: by default no log line carries a key or a scope, on
// the executed, replayed, mismatch, lease-lost and store-error paths; the
// lines that concern a key carry its hash. With LogKeys they carry both.
func TestLogsHashKeys(t *testing.T) {
	t.Parallel()
	const key, scope = "order-key-Qz81x", "tenant-Wy93v"
	for _, logKeys := range []bool{false, true} {
		var buf obstest.LogBuffer
		store := &flakyStore{Store: memstore.New(nil)}
		var lose sync.Mutex
		losing := false
		mw, err := idemhttp.New(&idemhttp.Config{
			Store:   store,
			Scope:   func(*http.Request) (string, error) { return scope, nil },
			Logger:  slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
			LogKeys: logKeys,
			// The renewal must be refused by the store (logged "lease
			// lost"), not come after the lease ended on the guard's clock.
			Lease: renewedLease,
		})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			lose.Lock()
			l := losing
			lose.Unlock()
			if l {
				// The record goes: the next renewal is refused (the
				// guard logs the lease lost) and the completion too.
				lease := idemhttp.ExecutionFrom(r.Context()).Lease()
				if err := store.Delete(context.Background(), lease.Scope, lease.Key); err != nil {
					t.Error(err)
				}
				<-r.Context().Done()
			}
			w.WriteHeader(http.StatusCreated)
		}))
		do := func(k, body string) int {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, request(http.MethodPost, "/x", k, body))
			return w.Code
		}
		if do(key, `{}`) != http.StatusCreated || do(key, `{}`) != http.StatusCreated || do(key, `{"b":2}`) != http.StatusUnprocessableEntity {
			t.Fatal("executed, replayed, mismatch: unexpected status")
		}
		lose.Lock()
		losing = true
		lose.Unlock()
		if c := do(key+"-lost", `{}`); c != http.StatusConflict {
			t.Fatalf("lease lost: %d", c)
		}
		store.acquire.Store(true)
		if c := do(key+"-down", `{}`); c != http.StatusServiceUnavailable {
			t.Fatalf("store error: %d", c)
		}
		// The guard cancels the execution before it logs the loss: the
		// request may be answered before that line is written.
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(buf.String(), "idem: lease lost") && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		out := buf.String()
		for _, want := range []string{"idem: lease lost", "lease lost, and the key holds no response", "store unavailable",
			`"idem.key_hash":"` + idem.HashKey(scope, key+"-lost") + `"`, `"idem.key_hash":"` + idem.HashKey(scope, key+"-down") + `"`} {
			if !strings.Contains(out, want) {
				t.Errorf("LogKeys %v: the log lacks %q:\n%s", logKeys, want, out)
			}
		}
		hasRaw := strings.Contains(out, key) || strings.Contains(out, scope)
		if hasRaw != logKeys {
			t.Errorf("LogKeys %v: raw key or scope in the log: %v\n%s", logKeys, hasRaw, out)
		}
		if logKeys && !strings.Contains(out, `"idem.key":"`+key+`-down"`) {
			t.Errorf("LogKeys: the key is not under idem.key:\n%s", out)
		}
	}
}
