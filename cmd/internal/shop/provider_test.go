package shop_test

import (
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/cmd/internal/payprov"
)

// newProvider starts a payment provider (payprov) for a test's shop and
// returns a client of it and the server; both end with the test.
func newProvider(t testing.TB) (*payprov.Client, *payprov.Server) {
	t.Helper()
	srv, err := payprov.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		srv.Close() // first: it ends the requests that faults hold
		ts.Close()
	})
	return &payprov.Client{BaseURL: ts.URL, HTTP: ts.Client()}, srv
}

// testProvider is newProvider's client, for a shop whose test does not
// look at the provider.
func testProvider(t testing.TB) *payprov.Client {
	c, _ := newProvider(t)
	return c
}
