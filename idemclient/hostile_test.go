package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// A key the caller put in the header map under a name that is not in
// canonical form (net/http sends such a field as it is, and a server
// folds the case) is the caller's key: the transport adds none of its
// own, so the server sees one key, the caller's, on every attempt.
func TestKeepsKeyUnderAnyCase(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"idempotency-key", "IDEMPOTENCY-KEY", "idempotency-Key"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := sendKeyedTwice(t, map[string][]string{name: {"order-7"}}); got != "order-7" {
				t.Fatalf("server saw key %q, want the caller's order-7", got)
			}
		})
	}
	// The same with a header name of the caller's choice.
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Values("X-Request-Key")
	}))
	defer srv.Close()
	tr := fast(nil)
	tr.Header = "X-Request-Key"
	req := mustPost(t, srv.URL)
	req.Header["x-request-key"] = []string{"mine"}
	if _, _, err := send(t, tr, req); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "mine" {
		t.Fatalf("server saw X-Request-Key %q, want [mine]", got)
	}
}

// An Idempotency-Key field that is present but empty (or blank) is no
// key: the transport gives the request a key of its own, the same on
// every attempt. It used to send the empty field as the caller's key, and
// a server that reads an empty key as none ran each attempt unguarded:
// the effect ran twice.
func TestEmptyKeyIsAbsent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"empty", []string{""}},
		{"spaces", []string{"   "}},
		{"tab", []string{"\t"}},
		{"two empty", []string{"", " "}},
	} {
		for _, field := range []string{"Idempotency-Key", "idempotency-key"} {
			t.Run(tc.name+" "+field, func(t *testing.T) {
				t.Parallel()
				var mu sync.Mutex
				effects := 0
				done := map[string]bool{}
				// A server that takes an empty key for none, and loses the
				// first answer after the effect (503).
				srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
					key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
					mu.Lock()
					defer mu.Unlock()
					if key == "" || !done[key] {
						effects++
						done[key] = key != ""
					}
					if n == 1 {
						w.WriteHeader(http.StatusServiceUnavailable)
						return
					}
					w.WriteHeader(http.StatusCreated)
				})
				req := mustPost(t, srv.URL)
				req.Header[field] = tc.values
				resp, _, err := send(t, fast(nil), req)
				if err != nil || resp.StatusCode != http.StatusCreated {
					t.Fatalf("%v %v", resp, err)
				}
				attempts := srv.seen()
				if len(attempts) != 2 {
					t.Fatalf("%d attempts, want 2", len(attempts))
				}
				mu.Lock()
				if effects != 1 {
					t.Errorf("%d effects, want 1", effects)
				}
				mu.Unlock()
				oneKey(t, attempts) // the same generated key on both, and no other field
				if got := req.Header[field]; len(got) != len(tc.values) {
					t.Fatalf("the caller's request was changed: %q", got)
				}
			})
		}
	}
}

// A key field beside empty or blank ones (one field with an empty value
// and the key, or an empty field and the key under two spellings of the
// name, which a server reads as one field of two values) carries the
// caller's key: the attempts send it alone. They used to send the empty
// value too, and a server that refuses a request with two key values
// (idemhttp answers 400) refused every attempt.
func TestKeyBesideEmptyValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fields map[string][]string
	}{
		{"empty then key", map[string][]string{"Idempotency-Key": {"", "k-1"}}},
		{"key then blank", map[string][]string{"Idempotency-Key": {"k-1", " \t"}}},
		{"two spellings", map[string][]string{"Idempotency-Key": {""}, "idempotency-key": {"k-1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if key := sendKeyedTwice(t, tc.fields); key != "k-1" {
				t.Fatalf("the attempts carried %q, want the caller's key k-1", key)
			}
		})
	}
}

// sendKeyedTwice sends a POST whose header has fields through a fast
// transport to a server that answers 503 and then 201, checks that the
// caller's request is left as it was and that both attempts carried one
// key, the same, and returns it.
func sendKeyedTwice(t *testing.T, fields map[string][]string) string {
	t.Helper()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	req := mustPost(t, srv.URL)
	for k, v := range fields {
		req.Header[k] = slices.Clone(v)
	}
	resp, _, err := send(t, fast(nil), req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("%v %v", resp, err)
	}
	for k, v := range fields {
		if got := req.Header[k]; !slices.Equal(got, v) {
			t.Fatalf("the caller's request was changed: %s %q", k, got)
		}
	}
	attempts := srv.seen()
	if len(attempts) != 2 {
		t.Fatalf("%d attempts, want 2", len(attempts))
	}
	return oneKey(t, attempts)
}

// A request built without a header map, given to RoundTrip directly
// (http.Client adds the map; a direct call does not), gets its key in a
// map of its own, and the caller's request keeps none. RoundTrip used to
// panic (assignment to entry in nil map).
func TestNilHeaderGetsKey(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	req := mustPost(t, srv.URL)
	req.Header = nil
	resp, _, err := send(t, fast(nil), req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("%v %v", resp, err)
	}
	oneKey(t, srv.seen())
	if req.Header != nil {
		t.Fatalf("the caller's request was given a header: %v", req.Header)
	}
}

// One Transport shared by 200 goroutines, each with its own request,
// against the idemhttp middleware whose handler fails the first run of
// every key with 503 and loses a quarter of the first answers: every
// request ends with its own order, created once.
func TestSharedByManyGoroutines(t *testing.T) {
	t.Parallel()
	const n = 200
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{} // body → completed runs
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		runs[string(body)+"/try"]++
		try := runs[string(body)+"/try"]
		if try > 1 {
			runs[string(body)]++
		}
		mu.Unlock()
		if try == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // released: the retry runs again
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order for "+string(body))
	})))
	defer srv.Close()
	tr := fast(nil)
	tr.Base = &http.Transport{MaxIdleConnsPerHost: 16}
	tr.MaxAttempts = 10
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range n {
		wg.Go(func() {
			body := fmt.Sprintf("sku-%d", g)
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || string(got) != "order for "+body {
				errs <- fmt.Errorf("%s: %d %q", body, resp.StatusCode, got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tr.CloseIdleConnections()
	mu.Lock()
	defer mu.Unlock()
	for g := range n {
		if c := runs[fmt.Sprintf("sku-%d", g)]; c != 1 {
			t.Errorf("sku-%d: created %d times, want 1", g, c)
		}
	}
}

// A context cancelled while the transport waits to retry leaves nothing
// open: every answer's body is closed, every connection the attempts
// opened is closed once idle connections are, and the body of the
// attempt that was never sent is closed.
func TestCancelLeavesNothingOpen(t *testing.T) {
	t.Parallel()
	var open atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, strings.Repeat("busy ", 100))
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	defer srv.Close()

	counter := &closeCounter{base: &http.Transport{}}
	bodies := &bodyCounter{}
	ctx, cancel := context.WithCancel(t.Context())
	tr := &idemclient.Transport{Base: counter, OnRetry: func(idemclient.Retry) { cancel() }}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	req.Body = bodies.body("x")
	req.GetBody = func() (io.ReadCloser, error) { return bodies.body("x"), nil }
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if got, closed := counter.bodies.Load(), counter.closed.Load(); got != 1 || closed != 1 {
		t.Fatalf("%d answers, %d closed; want 1 and 1", got, closed)
	}
	if made, closed := bodies.made.Load(), bodies.closed.Load(); made != 2 || closed != 2 {
		t.Fatalf("%d request bodies made, %d closed; want 2 and 2", made, closed)
	}
	tr.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for open.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open", open.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// bodyCounter makes request bodies and counts those closed.
type bodyCounter struct{ made, closed atomic.Int32 }

func (c *bodyCounter) body(s string) io.ReadCloser {
	c.made.Add(1)
	return &countingReader{Reader: strings.NewReader(s), c: c}
}

type countingReader struct {
	io.Reader
	c    *bodyCounter
	once sync.Once
}

func (r *countingReader) Close() error {
	r.once.Do(func() { r.c.closed.Add(1) })
	return nil
}
