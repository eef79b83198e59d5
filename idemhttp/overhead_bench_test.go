package idemhttp_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/memstore"
)

// overheadBodies are the two bodies of BenchmarkOverhead: 13 bytes, and
// a 1 KiB JSON object holding an array of 18 small objects whose members
// are not in order (so the canonical form sorts each of them).
var overheadBodies = func() []struct {
	name string
	body []byte
} {
	var b bytes.Buffer
	b.WriteString(`{"order":"A-1","lines":[`)
	for i := range 18 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%02d","qty":%d,"price":%d,"note":"x"}`, i, i%5+1, 100+i)
	}
	b.WriteString(`],"memo":"`)
	for b.Len() < 1024-2 {
		b.WriteByte('m')
	}
	b.WriteString(`"}`)
	return []struct {
		name string
		body []byte
	}{{"13B", []byte(`{"sku":"A-1"}`)}, {"1KiB", b.Bytes()}}
}()

// overheadHandler drains the body and answers 201 with 9 bytes.
func overheadHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":1}` + "\n"))
}

// BenchmarkOverhead is the middleware's cost against its handler as a
// user meets it: each request is built with httptest.NewRequest and
// served into a new recorder, bare and through the middleware on
// memstore (a first execution with a new key; a replay of one key).
// The overhead is idem minus bare.
//
//	go test -run '^$' -bench '^BenchmarkOverhead$' -benchmem -count 5 ./idemhttp/
func BenchmarkOverhead(b *testing.B) {
	for _, body := range overheadBodies {
		if body.name == "1KiB" && len(body.body) != 1024 {
			b.Fatalf("the 1 KiB body has %d bytes", len(body.body))
		}
		serve := func(b *testing.B, h http.Handler, key func(i int) string) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body.body)))
			i := 0
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(body.body))
				r.Header.Set("Content-Type", "application/json")
				if key != nil {
					r.Header.Set(idemhttp.HeaderIdempotencyKey, key(i))
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
				i++
			}
		}
		guarded := func(b *testing.B) http.Handler {
			m, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
			if err != nil {
				b.Fatal(err)
			}
			return m.Handler(http.HandlerFunc(overheadHandler))
		}
		b.Run(body.name+"/bare", func(b *testing.B) { serve(b, http.HandlerFunc(overheadHandler), nil) })
		b.Run(body.name+"/first", func(b *testing.B) {
			serve(b, guarded(b), func(i int) string { return "k-" + strconv.Itoa(i) })
		})
		b.Run(body.name+"/replay", func(b *testing.B) {
			serve(b, guarded(b), func(int) string { return "same" })
		})
	}
}

// BenchmarkCanonicalJSONUnsorted: CanonicalJSON of BenchmarkOverhead's
// 1 KiB body, whose 18 small objects all need sorting.
func BenchmarkCanonicalJSONUnsorted(b *testing.B) {
	src := overheadBodies[1].body
	var dst []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		var err error
		if dst, err = idemhttp.CanonicalJSON(dst[:0], src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalJSONDense: CanonicalJSON of the canonical form of
// BenchmarkOverhead's 1 KiB body: as many members, none out of order.
func BenchmarkCanonicalJSONDense(b *testing.B) {
	src, err := idemhttp.CanonicalJSON(nil, overheadBodies[1].body)
	if err != nil {
		b.Fatal(err)
	}
	var dst []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		if dst, err = idemhttp.CanonicalJSON(dst[:0], src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOverheadPaired is BenchmarkOverhead with the bare handler, a
// first execution and a replay interleaved in one loop (benchpair), so
// that the ratios hold on a noisy machine. It reports each one's mean
// (bare-ns, first-ns, replay-ns) and the overheads in multiples of the
// bare request: first-over-bare = (first − bare) / bare, and
// replay-over-bare. The three share one process, and so its garbage
// collector, which the records of the first executions keep busy.
//
//	go test -run '^$' -bench '^BenchmarkOverheadPaired$' -benchmem -benchtime 100000x -count 5 ./idemhttp/
func BenchmarkOverheadPaired(b *testing.B) {
	for _, body := range overheadBodies {
		b.Run(body.name, func(b *testing.B) {
			m, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
			if err != nil {
				b.Fatal(err)
			}
			guarded := m.Handler(http.HandlerFunc(overheadHandler))
			bare := http.HandlerFunc(overheadHandler)
			serve := func(h http.Handler, key string) {
				r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(body.body))
				r.Header.Set("Content-Type", "application/json")
				if key != "" {
					r.Header.Set(idemhttp.HeaderIdempotencyKey, key)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
			serve(guarded, "same")
			i := 0
			b.ReportAllocs()
			means := benchpair.Run(b,
				benchpair.Func{Name: "bare", F: func() { serve(bare, "") }},
				benchpair.Func{Name: "first", F: func() { i++; serve(guarded, "k-"+strconv.Itoa(i)) }},
				benchpair.Func{Name: "replay", F: func() { serve(guarded, "same") }},
			)
			benchpair.Ratio(b, "first-over-bare", means[1]-means[0], means[0])
			benchpair.Ratio(b, "replay-over-bare", means[2]-means[0], means[0])
		})
	}
}
