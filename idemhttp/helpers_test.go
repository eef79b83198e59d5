package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// env is one middleware over a fresh store, with a handler that counts
// its runs.
type env struct {
	t     *testing.T
	store idem.Store
	mw    *idemhttp.Middleware
	h     http.Handler
	calls atomic.Int64

	// block and blocked, when a test sets them, let its handler wait.
	block, blocked chan struct{}
}

// setup builds an env. cfg may be nil; its Store, if nil, is a fresh
// memstore. handler nil means: 201, JSON body echoing the request body.
func setup(t *testing.T, cfg *idemhttp.Config, handler http.HandlerFunc) *env {
	t.Helper()
	var c idemhttp.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Store == nil {
		c.Store = memstore.New(nil)
	}
	if handler == nil {
		handler = echoHandler
	}
	mw, err := idemhttp.New(&c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e := &env{t: t, store: c.Store, mw: mw}
	e.h = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		handler(w, r)
	}))
	return e
}

// echoHandler answers 201 with {"echo": <body>} and a few headers, some
// replayable and some not.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/things/1")
	w.Header()["ETag"] = []string{`"v1"`}
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Request-Note", "not replayed")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"echo":` + jsonString(string(body)) + `}`))
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// request builds a request; key "" means no Idempotency-Key header.
func request(method, target, key, body string) *http.Request {
	var r *http.Request
	if body == "" {
		r = httptest.NewRequest(method, target, nil)
	} else {
		r = httptest.NewRequest(method, target, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

// do serves one request and returns the recorded response.
func (e *env) do(method, target, key, body string) *httptest.ResponseRecorder {
	e.t.Helper()
	return e.serve(request(method, target, key, body))
}

func (e *env) serve(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

// record returns the store's record of (scope, key), or fails.
func (e *env) record(scope, key string) idem.Record {
	e.t.Helper()
	rec, err := e.store.Get(context.Background(), scope, key)
	if err != nil {
		e.t.Fatalf("Get(%q, %q): %v", scope, key, err)
	}
	return rec
}

// noRecord fails if (scope, key) has a record.
func (e *env) noRecord(scope, key string) {
	e.t.Helper()
	rec, err := e.store.Get(context.Background(), scope, key)
	if !errors.Is(err, idem.ErrNotFound) {
		e.t.Fatalf("Get(%q, %q) = %+v, %v; want ErrNotFound", scope, key, rec, err)
	}
}

func (e *env) wantCalls(n int64) {
	e.t.Helper()
	if got := e.calls.Load(); got != n {
		e.t.Fatalf("handler ran %d times, want %d", got, n)
	}
}

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// wantProblem checks that w is a problem+json answer with status and code.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, code string) problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Status != status || p.Code != code || p.Title == "" || p.Detail == "" || p.Type == "" {
		t.Fatalf("problem %+v, want status %d code %s with type, title and detail", p, status, code)
	}
	return p
}

// flakyStore wraps a store and fails the operations switched on.
type flakyStore struct {
	idem.Store
	acquire, complete, release, get atomic.Bool
	// noExtend, when set, fails the renewals of the execution with this
	// owner.
	noExtend atomic.Pointer[string]
}

var errDown = errors.New("store down")

func (s *flakyStore) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	if s.acquire.Load() {
		return idem.AcquireResult{}, errDown
	}
	return s.Store.Acquire(ctx, req)
}

func (s *flakyStore) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if s.complete.Load() {
		return errDown
	}
	return s.Store.Complete(ctx, l, resp, retention)
}

func (s *flakyStore) Release(ctx context.Context, l idem.Lease) error {
	if s.release.Load() {
		return errDown
	}
	return s.Store.Release(ctx, l)
}

func (s *flakyStore) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	if owner := s.noExtend.Load(); owner != nil && *owner == l.Owner {
		return idem.Lease{}, errDown
	}
	return s.Store.Extend(ctx, l, ttl)
}

// logBuffer collects a logger's output; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (s *flakyStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if s.get.Load() {
		return idem.Record{}, errDown
	}
	return s.Store.Get(ctx, scope, key)
}

// fakeClock is a settable clock for memstore.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
