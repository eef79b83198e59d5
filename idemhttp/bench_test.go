package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/httpharness"
	"github.com/idemkit/idem/memstore"
)

// The comparison of the middleware with the bare handler runs here on
// memstore; sqlstore's BenchmarkSQLite runs it on SQLite and redisstore's
// BenchmarkRedis on Redis (internal/httpharness).

func BenchmarkMemstore(b *testing.B) {
	httpharness.BenchStore(b, func(*testing.B) idem.Store { return memstore.New(nil) })
}

func BenchmarkFingerprintV1(b *testing.B) {
	r := httptest.NewRequest(http.MethodPost, "/orders?b=2&a=1", nil)
	r.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	b.SetBytes(int64(len(httpharness.BenchBody)))
	for b.Loop() {
		if _, err := idemhttp.FingerprintV1(r, httpharness.BenchBody); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonicalJSON(b *testing.B) {
	var dst []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(httpharness.BenchBody)))
	for b.Loop() {
		var err error
		if dst, err = idemhttp.CanonicalJSON(dst[:0], httpharness.BenchBody); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkObserver: the middleware with a counting Observer against none,
// in one loop. The Observer's floor: what any adapter adds at least.
func BenchmarkObserver(b *testing.B) {
	httpharness.BenchObserver(b, &httpharness.CountingObserver{})
}
