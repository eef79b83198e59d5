package idemhttp_test

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
	"github.com/idemkit/idem/memstore"
)

// benchBody is a 1 KiB JSON order.
var benchBody = func() []byte {
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

// jsonHandler is a typical small POST handler: it decodes the JSON body
// and encodes a JSON answer.
func jsonHandler(w http.ResponseWriter, r *http.Request) {
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

// trivialHandler does next to nothing: it drains the body and writes a
// fixed answer. The middleware's cost shows most against it.
func trivialHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(trivialAnswer)
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

type keyMode int

const (
	noKey   keyMode = iota
	newKey          // a new key per operation: every request is a first execution
	sameKey         // one key, completed before the timer starts: every request is a replay
)

// replayKey is the key of the sameKey requests.
var replayKey = []string{"bench-replay"}

// newServe returns a function that serves a request with the 1 KiB body
// through h, into a fresh httptest.ResponseRecorder, with the
// Idempotency-Key key (none if nil). The request is reused (its body
// reset), so its construction is not measured.
func newServe(h http.Handler, method string) func(key []string) *httptest.ResponseRecorder {
	rd := bytes.NewReader(benchBody)
	r := httptest.NewRequest(method, "/orders", nil)
	r.Header.Set("Content-Type", "application/json")
	body := readCloser{rd}
	return func(key []string) *httptest.ResponseRecorder {
		if key != nil {
			r.Header[idemhttp.HeaderIdempotencyKey] = key
		}
		rd.Reset(benchBody)
		r.Body = body
		r.ContentLength = int64(len(benchBody))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
}

// benchServe serves b.N requests through h with newServe.
func benchServe(b *testing.B, h http.Handler, method string, mode keyMode, want int) {
	serve := newServe(h, method)
	var keys []string
	switch mode {
	case newKey:
		keys = make([]string, b.N)
		for i := range keys {
			keys[i] = "bench-" + strconv.Itoa(i)
		}
	case sameKey:
		if w := serve(replayKey); w.Code != want {
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

// benchStore runs the comparison on one store: the bare handler against
// the middleware on first executions, replays and pass-through (GET).
func benchStore(b *testing.B, newStore func(b *testing.B) idem.Store) {
	for _, hc := range []struct {
		name string
		h    http.HandlerFunc
	}{{"json", jsonHandler}, {"trivial", trivialHandler}} {
		b.Run(hc.name, func(b *testing.B) {
			mw := func(b *testing.B) http.Handler {
				m, err := idemhttp.New(&idemhttp.Config{Store: newStore(b)})
				if err != nil {
					b.Fatal(err)
				}
				return m.Handler(hc.h)
			}
			b.Run("bare-post", func(b *testing.B) { benchServe(b, hc.h, http.MethodPost, noKey, 201) })
			b.Run("first", func(b *testing.B) { benchServe(b, mw(b), http.MethodPost, newKey, 201) })
			b.Run("replay", func(b *testing.B) { benchServe(b, mw(b), http.MethodPost, sameKey, 201) })
			b.Run("bare-get", func(b *testing.B) { benchServe(b, hc.h, http.MethodGet, noKey, 201) })
			b.Run("passthrough-get", func(b *testing.B) { benchServe(b, mw(b), http.MethodGet, noKey, 201) })
		})
	}
}

func BenchmarkMemstore(b *testing.B) {
	benchStore(b, func(*testing.B) idem.Store { return memstore.New(nil) })
}

func BenchmarkSQLite(b *testing.B) {
	benchStore(b, func(b *testing.B) idem.Store {
		_, store := newSQLite(b)
		return store
	})
}

func BenchmarkFingerprintV1(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/orders?b=2&a=1", nil)
	r.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		if _, err := idemhttp.FingerprintV1(r, benchBody); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonicalJSON(b *testing.B) {
	var dst []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		var err error
		if dst, err = idemhttp.CanonicalJSON(dst[:0], benchBody); err != nil {
			b.Fatal(err)
		}
	}
}
