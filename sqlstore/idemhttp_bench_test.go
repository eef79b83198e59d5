package sqlstore_test

import (
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/httpharness"
)

// BenchmarkSQLite runs the idemhttp middleware's comparison with the bare
// handler (httpharness.BenchStore, as idemhttp's BenchmarkMemstore) on the
// store over SQLite in a temporary file.
//
//	go test -run '^$' -bench '^BenchmarkSQLite$' -benchmem -count=5 ./sqlstore/
func BenchmarkSQLite(b *testing.B) {
	httpharness.BenchStore(b, func(b *testing.B) idem.Store {
		_, store := newSQLite(b)
		return store
	})
}
