package httpharness

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// BenchBody is a 1 KiB JSON order, the body of the benchmarks' requests.
var BenchBody = func() []byte {
	b := []byte(`{"sku":"A-1","quantity":2,"customer":{"id":42,"name":"Ada Lovelace","email":"ada@example.com"},"tags":["gift","express"],"note":"`)
	tail := []byte(`"}`)
	b = append(b, strings.Repeat("n", 1024-len(b)-len(tail))...)
	return append(b, tail...)
}()

type benchOrder struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
	Customer struct {
		ID    int64  `json:"id"`
		Name  string `json:"name"`
		Email string `json:"email"`
	} `json:"customer"`
	Tags []string `json:"tags"`
	Note string   `json:"note"`
}

var jsonContentType = []string{"application/json"}

// JSONHandler is a typical small POST handler: it decodes the JSON body
// (an order like BenchBody) and encodes a JSON answer with status 201.
func JSONHandler(w http.ResponseWriter, r *http.Request) {
	var o benchOrder
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": 1, "sku": o.SKU, "quantity": o.Quantity, "status": "WAIT_PAY"})
}

var trivialAnswer = []byte(`{"id":1,"sku":"A-1","quantity":2,"status":"WAIT_PAY"}`)

// TrivialHandler does next to nothing: it drains the body and writes a
// fixed answer with status 201. The middleware's cost shows most against
// it.
func TrivialHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(trivialAnswer)
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// KeyMode is how BenchServe chooses the Idempotency-Key of its requests.
type KeyMode int

const (
	NoKey   KeyMode = iota // no Idempotency-Key
	NewKey                 // a new key per operation: every request is a first execution
	SameKey                // ReplayKey, completed before the timer starts: every request is a replay
)

// ReplayKey is the key of the SameKey requests, as a header value.
var ReplayKey = []string{"bench-replay"}

// NewServe returns a function that serves a request with BenchBody
// through h, into a fresh httptest.ResponseRecorder, with the
// Idempotency-Key key (none if nil). The request is reused (its body
// reset), so its construction is not measured.
func NewServe(h http.Handler, method string) func(key []string) *httptest.ResponseRecorder {
	rd := bytes.NewReader(BenchBody)
	r := httptest.NewRequest(method, "/orders", nil)
	r.Header.Set("Content-Type", "application/json")
	body := readCloser{rd}
	return func(key []string) *httptest.ResponseRecorder {
		if key != nil {
			r.Header[idemhttp.HeaderIdempotencyKey] = key
		}
		rd.Reset(BenchBody)
		r.Body = body
		r.ContentLength = int64(len(BenchBody))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
}

// BenchServe serves b.N requests through h with NewServe, keyed by mode,
// and fails b on any status but want.
func BenchServe(b *testing.B, h http.Handler, method string, mode KeyMode, want int) {
	serve := NewServe(h, method)
	var keys []string
	switch mode {
	case NewKey:
		keys = make([]string, b.N)
		for i := range keys {
			keys[i] = "bench-" + strconv.Itoa(i)
		}
	case SameKey:
		if w := serve(ReplayKey); w.Code != want {
			b.Fatalf("priming: status %d: %s", w.Code, w.Body)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var key []string
		if keys != nil {
			key = keys[i : i+1]
		}
		if w := serve(key); w.Code != want {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// BenchStore runs the middleware's comparison on one store: for
// JSONHandler and TrivialHandler, the bare handler against the middleware
// on first executions, replays and pass-through (GET). newStore returns a
// fresh store for each sub-benchmark that uses one.
func BenchStore(b *testing.B, newStore func(b *testing.B) idem.Store) {
	for _, hc := range []struct {
		name string
		h    http.HandlerFunc
	}{{"json", JSONHandler}, {"trivial", TrivialHandler}} {
		b.Run(hc.name, func(b *testing.B) {
			mw := func(b *testing.B) http.Handler {
				m, err := idemhttp.New(&idemhttp.Config{Store: newStore(b)})
				if err != nil {
					b.Fatal(err)
				}
				return m.Handler(hc.h)
			}
			b.Run("bare-post", func(b *testing.B) { BenchServe(b, hc.h, http.MethodPost, NoKey, 201) })
			b.Run("first", func(b *testing.B) { BenchServe(b, mw(b), http.MethodPost, NewKey, 201) })
			b.Run("replay", func(b *testing.B) { BenchServe(b, mw(b), http.MethodPost, SameKey, 201) })
			b.Run("bare-get", func(b *testing.B) { BenchServe(b, hc.h, http.MethodGet, NoKey, 201) })
			b.Run("passthrough-get", func(b *testing.B) { BenchServe(b, mw(b), http.MethodGet, NoKey, 201) })
		})
	}
}
