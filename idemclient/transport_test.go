package idemclient_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/memstore"
)

// attempt is what the server saw of one attempt.
type attempt struct {
	method string
	key    string
	keys   int // Idempotency-Key fields
	body   []byte
}

// recorder is a test server that records every attempt and answers the
// n-th (from 1) with answer.
type recorder struct {
	*httptest.Server
	mu       sync.Mutex
	attempts []attempt
}

func newRecorder(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("server: reading the body: %v", err)
		}
		rec.mu.Lock()
		rec.attempts = append(rec.attempts, attempt{r.Method, r.Header.Get("Idempotency-Key"), len(r.Header.Values("Idempotency-Key")), body})
		n := len(rec.attempts)
		rec.mu.Unlock()
		answer(n, w, r)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) seen() []attempt {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]attempt(nil), rec.attempts...)
}

// oneKey fails unless every attempt carried exactly one key, the same,
// and returns it.
func oneKey(t *testing.T, attempts []attempt) string {
	t.Helper()
	if len(attempts) == 0 {
		t.Fatal("no attempt reached the server")
	}
	key := attempts[0].key
	for i, a := range attempts {
		if a.keys != 1 || a.key != key || key == "" {
			t.Fatalf("attempt %d carried %d keys (%q), attempt 1 carried %q", i+1, a.keys, a.key, key)
		}
	}
	return key
}

// fast is a transport whose backoff is short, on a base transport that
// opens a connection per attempt, so the server sees exactly the
// transport's attempts (net/http resends a keyed request on its own when
// a reused connection turns out closed).
func fast(retries *[]idemclient.Retry) *idemclient.Transport {
	var mu sync.Mutex
	return &idemclient.Transport{
		Base:      &http.Transport{DisableKeepAlives: true},
		BaseDelay: time.Millisecond,
		MaxDelay:  5 * time.Millisecond,
		OnRetry: func(r idemclient.Retry) {
			if retries != nil {
				mu.Lock()
				*retries = append(*retries, r)
				mu.Unlock()
			}
		},
	}
}

func post(t *testing.T, rt http.RoundTripper, url, body string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return send(t, rt, req)
}

// send round-trips req and reads the whole answer.
func send(t *testing.T, rt http.RoundTripper, req *http.Request) (*http.Response, []byte, error) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return resp, b, nil
}

func processing(w http.ResponseWriter, retryAfter string) {
	w.Header().Set("Retry-After", retryAfter)
	idemhttp.WriteProblem(w, http.StatusConflict, idemhttp.CodeProcessing, "", "still running")
}

// Each answer that may improve is retried once here, with the key of the
// first attempt; the final answer is the caller's, byte for byte.
func TestRetriesAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		first func(w http.ResponseWriter)
	}{
		{"409 PROCESSING", func(w http.ResponseWriter) { processing(w, "0") }},
		{"409 PROCESSING as application/json", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"status":409,"code":"PROCESSING"}`)
		}},
		{"429", func(w http.ResponseWriter) { w.WriteHeader(http.StatusTooManyRequests) }},
		{"502", func(w http.ResponseWriter) { w.WriteHeader(http.StatusBadGateway) }},
		{"503", func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }},
		{"503 STORE_UNAVAILABLE", func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "0")
			idemhttp.WriteProblem(w, http.StatusServiceUnavailable, idemhttp.CodeStoreUnavailable, "", "")
		}},
		{"504", func(w http.ResponseWriter) { w.WriteHeader(http.StatusGatewayTimeout) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					tc.first(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"order_no":"A-1"}`)
			})
			var retries []idemclient.Retry
			resp, body, err := post(t, fast(&retries), srv.URL, `{"sku":"BOOK-1"}`)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusCreated || string(body) != `{"order_no":"A-1"}` {
				t.Fatalf("answer %d %s", resp.StatusCode, body)
			}
			seen := srv.seen()
			if len(seen) != 2 || len(retries) != 1 || retries[0].Attempt != 1 || retries[0].StatusCode == 0 {
				t.Fatalf("%d attempts, retries %+v; want 2 attempts, one retry after attempt 1", len(seen), retries)
			}
			key := oneKey(t, seen)
			if got := resp.Request.Header.Get("Idempotency-Key"); got != key {
				t.Fatalf("resp.Request carries key %q, the server saw %q", got, key)
			}
			for i, a := range seen {
				if string(a.body) != `{"sku":"BOOK-1"}` {
					t.Fatalf("attempt %d body %q", i+1, a.body)
				}
			}
		})
	}
}

// dropAfterRequest is a server that, for its first attempts, reads the
// whole request and then closes the connection without answering (with
// reset: an RST instead of a FIN): the request may have run, the client
// cannot know.
func dropAfterRequest(t *testing.T, drops int, reset bool) *recorder {
	t.Helper()
	return newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n > drops {
			w.WriteHeader(http.StatusCreated)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		if reset {
			conn.(*net.TCPConn).SetLinger(0)
		}
		conn.Close()
	})
}

func TestRetriesNetworkErrors(t *testing.T) {
	t.Parallel()
	for _, reset := range []bool{false, true} {
		name := map[bool]string{false: "closed", true: "reset"}[reset]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := dropAfterRequest(t, 2, reset)
			var retries []idemclient.Retry
			resp, _, err := post(t, fast(&retries), srv.URL, "x=1")
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d", resp.StatusCode)
			}
			seen := srv.seen()
			if len(seen) != 3 || len(retries) != 2 {
				t.Fatalf("%d attempts, %d retries; want 3 and 2", len(seen), len(retries))
			}
			oneKey(t, seen)
			for _, r := range retries {
				if r.Err == nil || r.StatusCode != 0 {
					t.Fatalf("retry %+v: want the attempt's error", r)
				}
			}
		})
	}
}

// A refused connection is retried, and the request arrives once the
// server accepts connections again.
func TestRetriesRefusedConnections(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	proxy, err := netfault.New(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.Refuse(true)
	tr := fast(nil)
	var refused atomic.Int32
	tr.OnRetry = func(r idemclient.Retry) {
		if r.Err == nil {
			t.Errorf("retry after %d, want an error", r.StatusCode)
		}
		if refused.Add(1) == 2 {
			proxy.Refuse(false)
		}
	}
	resp, _, err := post(t, tr, "http://"+proxy.Addr()+"/orders", "x=1")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || refused.Load() != 2 || len(srv.seen()) != 1 {
		t.Fatalf("status %d after %d refusals, %d attempts served; want 201, 2, 1", resp.StatusCode, refused.Load(), len(srv.seen()))
	}
}

// The body is sent again byte for byte: from GetBody, and from the
// transport's copy when the request has no GetBody.
func TestRewindsBody(t *testing.T) {
	t.Parallel()
	payload := make([]byte, 300<<10)
	rand.Read(payload)
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"GetBody", func() io.Reader { return bytes.NewReader(payload) }},
		{"buffered", func() io.Reader {
			return io.MultiReader(bytes.NewReader(payload[:1000]), bytes.NewReader(payload[1000:]))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n < 3 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			req, err := http.NewRequest(http.MethodPost, srv.URL, tc.body())
			if err != nil {
				t.Fatal(err)
			}
			if (req.GetBody != nil) != (tc.name == "GetBody") {
				t.Fatalf("GetBody set: %v", req.GetBody != nil)
			}
			resp, _, err := send(t, fast(nil), req)
			if err != nil || resp.StatusCode != http.StatusCreated {
				t.Fatalf("%v %v", resp, err)
			}
			seen := srv.seen()
			if len(seen) != 3 {
				t.Fatalf("%d attempts, want 3", len(seen))
			}
			for i, a := range seen {
				if !bytes.Equal(a.body, payload) {
					t.Fatalf("attempt %d sent %d bytes, not the %d of the body", i+1, len(a.body), len(payload))
				}
			}
		})
	}
}

// A body without GetBody that is larger than MaxBufferedBody is sent once,
// whole, and its answer returned.
func TestLargeBodyWithoutGetBodyIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	payload := bytes.Repeat([]byte("0123456789"), 1000)
	for _, limit := range []int64{100, -1} {
		tr := fast(nil)
		tr.MaxBufferedBody = limit
		req, _ := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(bytes.NewReader(payload)))
		resp, _, err := send(t, tr, req)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("limit %d: %v %v", limit, resp, err)
		}
	}
	seen := srv.seen()
	if len(seen) != 2 {
		t.Fatalf("%d attempts for two requests, want 2", len(seen))
	}
	for _, a := range seen {
		if !bytes.Equal(a.body, payload) || a.key == "" {
			t.Fatalf("sent %d bytes with key %q, want the whole body with a key", len(a.body), a.key)
		}
	}
}

// Retry-After in seconds is waited for, and reported.
func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	var first time.Time
	var gap time.Duration
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			first = time.Now()
			processing(w, "1")
			return
		}
		gap = time.Since(first)
		w.WriteHeader(http.StatusCreated)
	})
	var retries []idemclient.Retry
	resp, _, err := post(t, fast(&retries), srv.URL, "x")
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("%v %v", resp, err)
	}
	if len(retries) != 1 || retries[0].Wait != time.Second || retries[0].StatusCode != http.StatusConflict {
		t.Fatalf("retries %+v, want one after a 409 waiting 1s", retries)
	}
	if gap < time.Second {
		t.Fatalf("the second attempt came %v after the first, before Retry-After", gap)
	}
}

// Retry-After as an HTTP date: the wait is until then; a date in the past
// asks for none, and the backoff alone spaces the retry (fast's: at most
// 1 ms after the first attempt).
func TestRetryAfterDate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		in       time.Duration
		min, max time.Duration
	}{
		{"future", 2 * time.Second, time.Millisecond, 2 * time.Second},
		{"past", -time.Hour, 0, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					w.Header().Set("Retry-After", time.Now().Add(tc.in).UTC().Format(http.TimeFormat))
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			var retries []idemclient.Retry
			resp, _, err := post(t, fast(&retries), srv.URL, "x")
			if err != nil || resp.StatusCode != http.StatusCreated {
				t.Fatalf("%v %v", resp, err)
			}
			if len(retries) != 1 || retries[0].Wait < tc.min || retries[0].Wait > tc.max {
				t.Fatalf("retries %+v, want one waiting %v to %v", retries, tc.min, tc.max)
			}
		})
	}
}

// A Retry-After beyond MaxRetryAfter is not waited for: the answer is
// returned, its body intact.
func TestRetryAfterBeyondMax(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "120")
		http.Error(w, "come back in two minutes", http.StatusTooManyRequests)
	})
	resp, body, err := post(t, fast(nil), srv.URL, "x")
	if err != nil || resp.StatusCode != http.StatusTooManyRequests || string(body) != "come back in two minutes\n" {
		t.Fatalf("%v %q %v", resp, body, err)
	}
	if n := len(srv.seen()); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

// A wait that would end after the context's deadline is not started: the
// last answer is returned as it came.
func TestStopsBeforeDeadline(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { processing(w, "5") })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, body, err := send(t, fast(nil), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusConflict || !bytes.Contains(body, []byte(`"code":"PROCESSING"`)) {
		t.Fatalf("answer %d %s, want the 409 PROCESSING", resp.StatusCode, body)
	}
	if n := len(srv.seen()); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	if ctx.Err() != nil {
		t.Fatal("the transport waited until the deadline")
	}
}

// http.Client.Timeout sets a deadline the transport sees too.
func TestStopsBeforeClientTimeout(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { processing(w, "10") })
	client := &http.Client{Transport: fast(nil), Timeout: 5 * time.Second}
	resp, err := client.Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || len(srv.seen()) != 1 {
		t.Fatalf("status %d after %d attempts, want 409 after 1", resp.StatusCode, len(srv.seen()))
	}
}

// A context cancelled during a wait ends the request with its error.
func TestCancelDuringWait(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { processing(w, "5") })
	ctx, cancel := context.WithCancel(t.Context())
	tr := fast(nil)
	tr.OnRetry = func(idemclient.Retry) { cancel() }
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	_, _, err := send(t, tr, req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if n := len(srv.seen()); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
}

// After MaxAttempts the last answer is returned as it came.
func TestStopsAtMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, max := range []int{0, 1, 3} {
		srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
			http.Error(w, "attempt "+string(rune('0'+n)), http.StatusBadGateway)
		})
		tr := fast(nil)
		tr.MaxAttempts = max
		resp, body, err := post(t, tr, srv.URL, "x")
		want := max
		if max == 0 {
			want = idemclient.DefaultMaxAttempts
		}
		if err != nil || resp.StatusCode != http.StatusBadGateway || string(body) != "attempt "+string(rune('0'+want))+"\n" {
			t.Fatalf("MaxAttempts %d: %v %q %v", max, resp, body, err)
		}
		seen := srv.seen()
		if len(seen) != want {
			t.Fatalf("MaxAttempts %d: %d attempts", max, len(seen))
		}
		oneKey(t, seen)
	}
	// Network errors too: the last error is returned.
	srv := dropAfterRequest(t, 100, false)
	tr := fast(nil)
	tr.MaxAttempts = 3
	if _, _, err := post(t, tr, srv.URL, "x"); err == nil {
		t.Fatal("no error after every attempt failed")
	}
	if n := len(srv.seen()); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
}

// Final answers are not retried, and are returned byte for byte.
func TestDoesNotRetryFinalAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
	}{
		{"201", func(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) }},
		{"500", func(w http.ResponseWriter) { http.Error(w, "bug", http.StatusInternalServerError) }},
		{"400", func(w http.ResponseWriter) { http.Error(w, "bad", http.StatusBadRequest) }},
		{"422 KEY_MISMATCH", func(w http.ResponseWriter) {
			idemhttp.WriteProblem(w, http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch, "", "")
		}},
		{"409 another code", func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "0")
			idemhttp.WriteProblem(w, http.StatusConflict, "OUT_OF_STOCK", "", "sold out")
		}},
		{"409 plain", func(w http.ResponseWriter) { http.Error(w, `{"code":"PROCESSING"}`, http.StatusConflict) }},
		{"409 without code", func(w http.ResponseWriter) {
			idemhttp.WriteProblem(w, http.StatusConflict, "", "", "")
		}},
		{"replayed 400", func(w http.ResponseWriter) {
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			http.Error(w, "bad coupon", http.StatusBadRequest)
		}},
		{"replayed 503", func(w http.ResponseWriter) {
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			http.Error(w, "stored answer", http.StatusServiceUnavailable)
		}},
		{"replayed 429", func(w http.ResponseWriter) {
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			w.Header().Set("Retry-After", "0")
			http.Error(w, "stored answer", http.StatusTooManyRequests)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { tc.answer(w) })
			want := httptest.NewRecorder()
			tc.answer(want)
			var retries []idemclient.Retry
			resp, body, err := post(t, fast(&retries), srv.URL, "x")
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != want.Code || !bytes.Equal(body, want.Body.Bytes()) {
				t.Fatalf("answer %d %q, want %d %q", resp.StatusCode, body, want.Code, want.Body)
			}
			if n := len(srv.seen()); n != 1 || len(retries) != 0 {
				t.Fatalf("%d attempts, %d retries; want 1 and 0", n, len(retries))
			}
		})
	}
}

// A method that is not covered is sent once and untouched; RetryMethods
// retries it without a key; a method added to Methods gets a key.
func TestMethods(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		method        string
		methods       []string
		retryMethods  []string
		attempts      int
		key           bool
		uncoveredBody bool
	}{
		{http.MethodGet, nil, nil, 1, false, false},
		{http.MethodPut, nil, nil, 1, false, true},
		{http.MethodDelete, nil, nil, 1, false, false},
		{"post", nil, nil, 1, false, true}, // methods are case-sensitive
		{http.MethodPost, []string{}, nil, 1, false, true},
		{http.MethodPatch, nil, nil, 3, true, true},
		{http.MethodGet, nil, []string{http.MethodGet}, 3, false, false},
		{http.MethodPut, nil, []string{http.MethodPut}, 3, false, true},
		{http.MethodPut, []string{http.MethodPut}, nil, 3, true, true},
	} {
		srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
		tr := fast(nil)
		tr.Methods, tr.RetryMethods, tr.MaxAttempts = tc.methods, tc.retryMethods, 3
		var body io.Reader
		if tc.uncoveredBody {
			body = strings.NewReader("x")
		}
		req, _ := http.NewRequest(tc.method, srv.URL, body)
		if _, _, err := send(t, tr, req); err != nil {
			t.Fatal(err)
		}
		seen := srv.seen()
		if len(seen) != tc.attempts {
			t.Errorf("%s (methods %q, retry %q): %d attempts, want %d", tc.method, tc.methods, tc.retryMethods, len(seen), tc.attempts)
		}
		for _, a := range seen {
			if (a.key != "") != tc.key {
				t.Errorf("%s (methods %q, retry %q): key %q, want one: %v", tc.method, tc.methods, tc.retryMethods, a.key, tc.key)
			}
		}
		if tc.key {
			oneKey(t, seen)
		}
	}
}

// A request with a key keeps it; without one each request gets its own;
// the caller's request is not modified.
func TestKeys(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n%2 == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	tr := fast(nil)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "order-7")
	req.Header.Set("X-Other", "1")
	if _, _, err := send(t, tr, req); err != nil {
		t.Fatal(err)
	}
	if got := oneKey(t, srv.seen()[:2]); got != "order-7" {
		t.Fatalf("the key %q was replaced by %q", "order-7", got)
	}

	req, _ = http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	req.Header.Set("X-Other", "1")
	before := req.Header.Clone()
	if _, _, err := send(t, tr, req); err != nil {
		t.Fatal(err)
	}
	if _, _, err := send(t, tr, req.Clone(t.Context())); err != nil { // its body is spent; sent empty
		t.Fatal(err)
	}
	seen := srv.seen()
	a, b := oneKey(t, seen[2:4]), oneKey(t, seen[4:6])
	if a == b || len(a) != 26 {
		t.Fatalf("generated keys %q and %q: want two different 26-character keys", a, b)
	}
	if len(req.Header) != len(before) || req.Header.Get("Idempotency-Key") != "" {
		t.Fatalf("the caller's header changed: %v, was %v", req.Header, before)
	}

	// Another header name, another generator.
	tr = fast(nil)
	tr.Header = "X-Request-Key"
	tr.NewKey = func() string { return "fixed" }
	var got string
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("X-Request-Key") + "/" + r.Header.Get("Idempotency-Key")
	}))
	defer srv2.Close()
	if _, _, err := post(t, tr, srv2.URL, "x"); err != nil || got != "fixed/" {
		t.Fatalf("server saw %q (%v), want fixed/", got, err)
	}
}

// The answers that are retried are drained and closed; the last one is
// the caller's.
func TestClosesIntermediateAnswers(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n < 4 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, strings.Repeat("busy ", 1000))
			return
		}
		io.WriteString(w, "done")
	})
	counter := &closeCounter{base: &http.Transport{}}
	tr := fast(nil)
	tr.Base = counter
	resp, err := tr.RoundTrip(mustPost(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	if got := counter.bodies.Load(); got != 4 {
		t.Fatalf("%d answers, want 4", got)
	}
	if got := counter.closed.Load(); got != 3 {
		t.Fatalf("%d answers closed before the caller's, want 3", got)
	}
	if got := counter.drained.Load(); got != 3 {
		t.Fatalf("%d answers drained to the end, want 3", got)
	}
	resp.Body.Close()
}

func mustPost(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// closeCounter counts the answers of base, those read to EOF and those
// closed.
type closeCounter struct {
	base                    http.RoundTripper
	bodies, drained, closed atomic.Int32
}

func (c *closeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err == nil {
		c.bodies.Add(1)
		resp.Body = &countedBody{ReadCloser: resp.Body, c: c}
	}
	return resp, err
}

// CloseIdleConnections closes base's idle connections, as
// idemclient.Transport.CloseIdleConnections expects of its Base: without
// it the call stops here, and a connection base put back in its pool stays
// open.
func (c *closeCounter) CloseIdleConnections() {
	if b, ok := c.base.(interface{ CloseIdleConnections() }); ok {
		b.CloseIdleConnections()
	}
}

type countedBody struct {
	io.ReadCloser
	c   *closeCounter
	eof bool
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.eof {
		b.eof = true
		b.c.drained.Add(1)
	}
	return n, err
}

func (b *countedBody) Close() error {
	b.c.closed.Add(1)
	return b.ReadCloser.Close()
}

// A certificate the client refuses is not retried.
func TestDoesNotRetryCertificateErrors(t *testing.T) {
	t.Parallel()
	var handled atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handled.Add(1) }))
	srv.Config.ErrorLog = nil
	defer srv.Close()
	var retries []idemclient.Retry
	tr := fast(&retries)
	_, _, err := post(t, tr, srv.URL, "x")
	if err == nil {
		t.Fatal("no error from an untrusted certificate")
	}
	if len(retries) != 0 || handled.Load() != 0 {
		t.Fatalf("%d retries, %d handled; want none", len(retries), handled.Load())
	}
}

// Bad settings fail the request with an error naming the field, and close
// its body.
func TestBadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		tr   idemclient.Transport
		want string
	}{
		{"MaxAttempts", idemclient.Transport{MaxAttempts: -1}, "MaxAttempts"},
		{"BaseDelay", idemclient.Transport{BaseDelay: -1}, "BaseDelay"},
		{"Header", idemclient.Transport{Header: "Idempotency Key"}, "Header"},
		{"NewKey", idemclient.Transport{NewKey: func() string { return "" }}, "NewKey"},
	} {
		body := &closedBody{Reader: strings.NewReader("x")}
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", body)
		_, err := tc.tr.RoundTrip(req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.want)
		}
		if !body.closed {
			t.Errorf("%s: the request body was not closed", tc.name)
		}
	}
}

type closedBody struct {
	io.Reader
	closed bool
}

func (b *closedBody) Close() error { b.closed = true; return nil }

// Against the idemhttp middleware: a duplicate that arrives while the
// first request runs gets 409 PROCESSING, waits, and gets the first's
// answer; the handler runs once.
func TestMiddlewareDuplicateWaitsForFirst(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order_no":"A-1"}`)
	})))
	defer srv.Close()

	newReq := func() *http.Request {
		req := mustPost(t, srv.URL)
		req.Header.Set("Idempotency-Key", "dup-1")
		return req
	}
	first := make(chan error, 1)
	go func() {
		resp, body, err := send(t, fast(nil), newReq())
		if err == nil && (resp.StatusCode != http.StatusCreated || string(body) != `{"order_no":"A-1"}`) {
			err = errors.New("first: " + resp.Status + " " + string(body))
		}
		first <- err
	}()
	<-started
	tr := fast(nil)
	tr.OnRetry = func(r idemclient.Retry) {
		if r.StatusCode != http.StatusConflict {
			t.Errorf("retry after %d %v, want 409", r.StatusCode, r.Err)
		}
		select {
		case <-release:
		default:
			close(release) // the first finishes once the duplicate saw 409
		}
	}
	resp, body, err := send(t, tr, newReq())
	if err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || string(body) != `{"order_no":"A-1"}` || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("duplicate: %d %q replayed=%q, want the first's answer, replayed", resp.StatusCode, body, resp.Header.Get(idemhttp.HeaderReplayed))
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// Retry-After is a minimum, not the whole wait: a server that answers 409
// PROCESSING with "Retry-After: 0" every time still gets the backoff's
// spacing, and the attempts are not spent in a burst against it.
func TestRetryAfterZeroStillBacksOff(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) { processing(w, "0") })
	var retries []idemclient.Retry
	tr := fast(&retries)
	tr.BaseDelay, tr.MaxDelay, tr.MaxAttempts = 40*time.Millisecond, 40*time.Millisecond, 6
	resp, _, err := post(t, tr, srv.URL, `{"sku":"BOOK-1"}`)
	if err != nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("answer %v, %v; want the last 409", resp, err)
	}
	if len(srv.seen()) != 6 || len(retries) != 5 {
		t.Fatalf("%d attempts, %d retries; want 6 and 5", len(srv.seen()), len(retries))
	}
	var total time.Duration
	for _, r := range retries {
		if r.Wait < 0 || r.Wait > 40*time.Millisecond {
			t.Fatalf("wait %v outside the backoff's [0, 40ms]", r.Wait)
		}
		total += r.Wait
	}
	// Five full-jitter draws from [0, 40ms] are all 0 with a negligible
	// chance; taking Retry-After: 0 as the wait makes every one 0.
	if total == 0 {
		t.Fatalf("waits %v: the retries came in a burst", retries)
	}
}
