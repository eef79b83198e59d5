package idemclient_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemclient"
)

// canned answers every request at once, without a network.
type canned struct{}

func (canned) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// The transport's own cost on a request that succeeds at once: the clone,
// the key, the body's rewind setup. Compare with the base alone.
func BenchmarkTransport(b *testing.B) {
	for _, bc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"base", canned{}},
		{"idemclient", &idemclient.Transport{Base: canned{}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, "http://shop.example/orders", strings.NewReader(`{"sku":"BOOK-1","quantity":2}`))
				resp, err := bc.rt.RoundTrip(req)
				if err != nil || resp.StatusCode != http.StatusCreated {
					b.Fatal(resp, err)
				}
			}
		})
	}
}
