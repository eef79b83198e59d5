package httpharness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// Env is one middleware over a store, with a handler that counts its
// runs.
type Env struct {
	t *testing.T

	// Store is the middleware's store.
	Store idem.Store
	// Middleware is the middleware, built from the Config given to Setup.
	Middleware *idemhttp.Middleware
	// Handler is the test's handler behind Middleware, counted.
	Handler http.Handler

	calls atomic.Int64

	// Block and Blocked are free for a test's handler: a test that sets
	// them can make its handler wait.
	Block, Blocked chan struct{}
}

// Setup builds an Env. cfg may be nil; its Store, if nil, is a fresh
// memstore. handler nil means EchoHandler.
func Setup(t *testing.T, cfg *idemhttp.Config, handler http.HandlerFunc) *Env {
	t.Helper()
	var c idemhttp.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Store == nil {
		c.Store = memstore.New(nil)
	}
	if handler == nil {
		handler = EchoHandler
	}
	mw, err := idemhttp.New(&c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e := &Env{t: t, Store: c.Store, Middleware: mw}
	e.Handler = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		handler(w, r)
	}))
	return e
}

// EchoHandler answers 201 with {"echo": <body>} and a few headers, some
// replayable (Content-Type, Location, ETag) and some not (Set-Cookie,
// X-Request-Note).
func EchoHandler(w http.ResponseWriter, r *http.Request) {
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

// Request builds a request; key "" means no Idempotency-Key header, body
// "" no body (otherwise the body is sent as application/json).
func Request(method, target, key, body string) *http.Request {
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

// Do serves one request built by Request and returns the recorded
// response.
func (e *Env) Do(method, target, key, body string) *httptest.ResponseRecorder {
	e.t.Helper()
	return e.Serve(Request(method, target, key, body))
}

// Serve serves r through the middleware and returns the recorded
// response.
func (e *Env) Serve(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	e.Handler.ServeHTTP(w, r)
	return w
}

// Record returns the store's record of (scope, key), or fails the test.
func (e *Env) Record(scope, key string) idem.Record {
	e.t.Helper()
	rec, err := e.Store.Get(context.Background(), scope, key)
	if err != nil {
		e.t.Fatalf("Get(%q, %q): %v", scope, key, err)
	}
	return rec
}

// NoRecord fails the test if (scope, key) has a record.
func (e *Env) NoRecord(scope, key string) {
	e.t.Helper()
	rec, err := e.Store.Get(context.Background(), scope, key)
	if !errors.Is(err, idem.ErrNotFound) {
		e.t.Fatalf("Get(%q, %q) = %+v, %v; want ErrNotFound", scope, key, rec, err)
	}
}

// WantCalls fails the test unless the handler ran n times.
func (e *Env) WantCalls(n int64) {
	e.t.Helper()
	if got := e.calls.Load(); got != n {
		e.t.Fatalf("handler ran %d times, want %d", got, n)
	}
}

// Problem is an application/problem+json body as the middleware writes
// it.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// WantProblem checks that w is a problem+json answer with status and
// code, and a type, title and detail; it returns the problem.
func WantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, code string) Problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Status != status || p.Code != code || p.Title == "" || p.Detail == "" || p.Type == "" {
		t.Fatalf("problem %+v, want status %d code %s with type, title and detail", p, status, code)
	}
	return p
}

// UnfilteredResponse returns a new response for a handler to store itself
// (Execution.Complete or CompleteTx): 201, eight header names of which
// only Content-Type, Location and content-language are replayable, and a
// body of 100 bytes. CheckCompletionFiltered expects a MaxResponseBody
// under 100.
func UnfilteredResponse() idem.Response {
	return idem.Response{
		StatusCode: http.StatusCreated,
		Header: map[string][]string{
			"Content-Type":     {"text/plain"},
			"Location":         {"/orders/1"},
			"Set-Cookie":       {"session=secret"},
			"Authorization":    {"Bearer secret"},
			"Connection":       {"close"},
			"Keep-Alive":       {"timeout=5"},
			"X-Internal":       {"not replayable"},
			"content-language": {"en"}, // not canonical: kept as Content-Language
		},
		Body: []byte(strings.Repeat("x", 100)),
	}
}

// CheckCompletionFiltered sends POST /orders with key "k" twice through
// e, whose handler stores UnfilteredResponse itself, writes it, and runs
// under a MaxResponseBody below its body's size. It checks that the first
// client gets the whole response, that the record keeps only the
// replayable headers with the body omitted, that the replay sends none of
// the others, and that the handler ran once.
func CheckCompletionFiltered(t *testing.T, e *Env) {
	t.Helper()
	big := string(UnfilteredResponse().Body)
	first := e.Do(http.MethodPost, "/orders", "k", `A-1`)
	if first.Code != http.StatusCreated || first.Body.String() != big {
		t.Fatalf("first: %d %q", first.Code, first.Body)
	}
	rec := e.Record("", "k")
	want := map[string][]string{"Content-Type": {"text/plain"}, "Location": {"/orders/1"}, "Content-Language": {"en"}}
	if rec.Status != idem.StatusCompleted || rec.Response == nil || !rec.Response.BodyOmitted ||
		len(rec.Response.Body) != 0 || fmt.Sprint(rec.Response.Header) != fmt.Sprint(want) {
		t.Fatalf("stored response %+v, want headers %v and the body omitted", rec.Response, want)
	}
	replay := e.Do(http.MethodPost, "/orders", "k", `A-1`)
	h := replay.Header()
	if replay.Code != http.StatusCreated || replay.Body.Len() != 0 ||
		h.Get(idemhttp.HeaderReplayed) != "true" || h.Get(idemhttp.HeaderBodyOmitted) != "true" ||
		h.Get("Location") != "/orders/1" {
		t.Fatalf("replay: %d %v %q", replay.Code, h, replay.Body)
	}
	for _, name := range []string{"Set-Cookie", "Authorization", "Connection", "Keep-Alive", "X-Internal"} {
		if v := h.Values(name); len(v) != 0 {
			t.Errorf("replay has %s: %q", name, v)
		}
	}
	e.WantCalls(1)
}
