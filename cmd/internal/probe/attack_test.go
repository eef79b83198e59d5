package probe_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/cmd/internal/probe"
)

// TestInterrupted: a run whose context ends while a request or a read of
// the effect waits for its answer ends with the context's error, not
// with an error that blames the API (the first request "got no answer",
// the effect "could not be read"): idem probe then says "interrupted",
// not "check that the server is up".
func TestInterrupted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// hang reports whether the server holds the request (the nth
		// POST, the nth read of the count) until the run is cancelled.
		hang func(r *http.Request, posts, reads int64) bool
	}{
		{"the first request", func(r *http.Request, posts, reads int64) bool { return r.Method == http.MethodPost && posts == 1 }},
		{"the first read of the effect", func(r *http.Request, posts, reads int64) bool { return r.Method == http.MethodGet && reads == 1 }},
		{"a read of the effect after a check", func(r *http.Request, posts, reads int64) bool { return r.Method == http.MethodGet && reads == 2 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stop := make(chan struct{}) // closed when Run returned
			var posts, reads, created atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var p, n int64
				if r.Method == http.MethodPost {
					p = posts.Add(1)
				} else {
					n = reads.Add(1)
				}
				if c.hang(r, p, n) {
					cancel()
					select {
					case <-r.Context().Done():
					case <-stop:
					}
					return
				}
				if r.Method == http.MethodGet {
					fmt.Fprintf(w, `{"count":%d}`, created.Load())
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":%d}`, created.Add(1))
			}))
			t.Cleanup(srv.Close)
			rep, err := probe.Run(ctx, &probe.Config{URL: srv.URL + "/api", Body: []byte(fakeBody), EffectURL: srv.URL + "/count", EffectPath: "count"})
			close(stop)
			var na *probe.NotAcceptedError
			var ee *probe.EffectError
			if rep != nil || !errors.Is(err, context.Canceled) || errors.As(err, &na) || errors.As(err, &ee) {
				t.Fatalf("Run: %v, %T %v; want no report and the context's error alone", rep != nil, err, err)
			}
		})
	}
}
