package shop_test

import (
	"testing"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/payprov/payprovtest"
)

// newProvider starts a payment provider (payprov) for a test's shop and
// returns a client of it and the server; both end with the test.
func newProvider(t testing.TB) (*payprov.Client, *payprov.Server) {
	t.Helper()
	return payprovtest.Start(t, nil)
}

// testProvider is newProvider's client, for a shop whose test does not
// look at the provider.
func testProvider(t testing.TB) *payprov.Client {
	c, _ := newProvider(t)
	return c
}
