// Package payprovtest starts a simulated payment provider (package
// payprov) for a test.
package payprovtest

import (
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/cmd/internal/payprov"
)

// Start starts a provider configured by cfg (nil: defaults) on a
// loopback port and returns a client of it and the server; both end with
// the test (the server first: it ends the requests that faults hold).
func Start(t testing.TB, cfg *payprov.Config) (*payprov.Client, *payprov.Server) {
	t.Helper()
	srv, err := payprov.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		srv.Close()
		ts.Close()
	})
	return &payprov.Client{BaseURL: ts.URL, HTTP: ts.Client()}, srv
}
