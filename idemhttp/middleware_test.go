package idemhttp_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/memstore"
)

// Row: method not covered → passes through untouched.
func TestPassThrough(t *testing.T) {
	t.Parallel()
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodHead} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			var seen *http.Request
			e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
				seen = r
				w.WriteHeader(http.StatusOK)
			})
			for range 2 {
				r := request(method, "/things", "k1", "")
				w := e.Serve(r)
				if w.Code != http.StatusOK || seen != r {
					t.Fatalf("status %d, handler got the same request: %v", w.Code, seen == r)
				}
				if w.Header().Get(idemhttp.HeaderReplayed) != "" {
					t.Fatal("pass-through marked replayed")
				}
			}
			e.WantCalls(2)
			e.NoRecord("", "k1")
		})
	}
	t.Run("configured methods", func(t *testing.T) {
		t.Parallel()
		e := setup(t, &idemhttp.Config{Methods: []string{http.MethodPut}}, nil)
		e.Do(http.MethodPost, "/x", "", "") // POST is no longer covered: no 400
		e.Do(http.MethodPut, "/x", "put-1", `{}`)
		e.Do(http.MethodPut, "/x", "put-1", `{}`)
		e.WantCalls(2)
		e.Record("", "put-1")
	})
}

// Row: covered, no key, key required → 400; KeyOptional lets it through.
func TestMissingKey(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, nil)
	for _, method := range []string{http.MethodPost, http.MethodPatch} {
		w := e.Do(method, "/things", "", `{"a":1}`)
		p := wantProblem(t, w, http.StatusBadRequest, idemhttp.CodeMissingKey)
		if !strings.HasSuffix(p.Type, "#missing_key") {
			t.Errorf("type %q", p.Type)
		}
	}
	e.WantCalls(0)

	t.Run("KeyOptional", func(t *testing.T) {
		t.Parallel()
		var exec *idem.Execution
		var body string
		e := setup(t, &idemhttp.Config{KeyOptional: true}, func(w http.ResponseWriter, r *http.Request) {
			exec = idemhttp.ExecutionFrom(r.Context())
			b, _ := io.ReadAll(r.Body)
			body = string(b)
			w.WriteHeader(http.StatusCreated)
		})
		w := e.Do(http.MethodPost, "/things", "", `{"a":1}`)
		if w.Code != http.StatusCreated || exec != nil || body != `{"a":1}` {
			t.Fatalf("status %d, execution %v, body %q", w.Code, exec, body)
		}
		// A malformed key is still refused.
		w = e.Do(http.MethodPost, "/things", " ", `{"a":1}`)
		wantProblem(t, w, http.StatusBadRequest, idemhttp.CodeInvalidKey)
		e.WantCalls(1)
	})
}

// Row: key malformed → 400; an RFC 8941 quoted string is unquoted.
func TestInvalidKey(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"empty":            "",
		"spaces":           "   ",
		"too long":         strings.Repeat("k", 256),
		"control":          "abc\x01def",
		"DEL":              "abc\x7f",
		"invalid UTF-8":    "abc\xff",
		"bad escape":       `"ab\c"`,
		"unterminated":     `"abc`,
		"quoted empty":     `""`,
		"parameters":       `"abc";x=1`,
		"quoted non-ASCII": "\"caf\xc3\xa9\"",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil, nil)
			r := request(http.MethodPost, "/things", "", `{}`)
			r.Header["Idempotency-Key"] = []string{value}
			w := e.Serve(r)
			wantProblem(t, w, http.StatusBadRequest, idemhttp.CodeInvalidKey)
			e.WantCalls(0)
		})
	}
	t.Run("two fields", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil, nil)
		r := request(http.MethodPost, "/things", "", `{}`)
		r.Header["Idempotency-Key"] = []string{"a", "b"}
		wantProblem(t, e.Serve(r), http.StatusBadRequest, idemhttp.CodeInvalidKey)
		e.WantCalls(0)
		e.NoRecord("", "a")
	})
	t.Run("quoted", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil, nil)
		w := e.Do(http.MethodPost, "/things", `"order-\"7\""`, `{}`)
		if w.Code != http.StatusCreated {
			t.Fatalf("status %d", w.Code)
		}
		e.Record("", `order-"7"`)
		// The same key, unquoted, is the same key: a replay.
		w = e.Do(http.MethodPost, "/things", `order-"7"`, `{}`)
		if w.Header().Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatal("unquoted spelling of the key did not replay")
		}
		e.WantCalls(1)
	})
	t.Run("255 bytes", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil, nil)
		key := strings.Repeat("k", 255)
		if w := e.Do(http.MethodPost, "/things", key, `{}`); w.Code != http.StatusCreated {
			t.Fatalf("status %d", w.Code)
		}
		e.Record("", key)
	})
}

// Rows: first request (handler runs, response stored) and retry (stored
// status, replayable headers and body, Idempotent-Replayed; handler does
// not run).
func TestFirstAndReplay(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemhttp.Config{ReplayHeaders: []string{"x-request-note"}}, nil)
	first := e.Do(http.MethodPost, "/things?b=2&a=1", "key-1", `{"n":1}`)
	if first.Code != http.StatusCreated || first.Body.String() != `{"echo":"{\"n\":1}"}` {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	if first.Header().Get("Set-Cookie") != "session=secret" {
		t.Error("first response lost Set-Cookie")
	}
	if v := first.Header().Get(idemhttp.HeaderReplayed); v != "" {
		t.Errorf("first response has %s: %q", idemhttp.HeaderReplayed, v)
	}

	rec := e.Record("", "key-1")
	if rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.StatusCode != http.StatusCreated {
		t.Fatalf("record %+v", rec)
	}
	if !strings.HasPrefix(string(rec.Fingerprint), "v1:") || len(rec.Fingerprint) != 67 {
		t.Errorf("fingerprint %q", rec.Fingerprint)
	}
	wantHeader := map[string]string{
		"Content-Type":   "application/json",
		"Location":       "/things/1",
		"Etag":           `"v1"`,
		"X-Request-Note": "not replayed",
	}
	if len(rec.Response.Header) != len(wantHeader) {
		t.Errorf("stored headers %v, want %v", rec.Response.Header, wantHeader)
	}
	for name, v := range wantHeader {
		if got := rec.Response.Header[name]; len(got) != 1 || got[0] != v {
			t.Errorf("stored %s = %q, want %q", name, got, v)
		}
	}

	for range 3 {
		replay := e.Do(http.MethodPost, "/things?a=1&b=2", "key-1", `{"n":1}`)
		if replay.Code != first.Code || !bytes.Equal(replay.Body.Bytes(), first.Body.Bytes()) {
			t.Fatalf("replay: %d %s", replay.Code, replay.Body)
		}
		if replay.Header().Get(idemhttp.HeaderReplayed) != "true" {
			t.Error("replay without Idempotent-Replayed: true")
		}
		if replay.Header().Get("Set-Cookie") != "" {
			t.Error("Set-Cookie replayed")
		}
		for name, v := range wantHeader {
			if got := replay.Header()[name]; len(got) != 1 || got[0] != v {
				t.Errorf("replayed %s = %q, want %q", name, got, v)
			}
		}
	}
	e.WantCalls(1)
}

// Two JSON bodies that differ only in key order and whitespace are the
// same request.
func TestJSONCanonicalReplay(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, nil)
	first := e.Do(http.MethodPost, "/orders", "k", `{"sku":"A-1","qty":2,"meta":{"z":[1, 2.50],"a":null}}`)
	second := e.Do(http.MethodPost, "/orders", "k", "{\n  \"meta\": {\"a\": null, \"z\": [1,2.50]},\n  \"qty\": 2,\n  \"sku\": \"A-\\u0031\"\n}")
	if second.Header().Get(idemhttp.HeaderReplayed) != "true" || second.Body.String() != first.Body.String() {
		t.Fatalf("not replayed: %d %s", second.Code, second.Body)
	}
	e.WantCalls(1)
	// A number written differently is a different request.
	w := e.Do(http.MethodPost, "/orders", "k", `{"sku":"A-1","qty":2.0,"meta":{"z":[1,2.50],"a":null}}`)
	wantProblem(t, w, http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
}

// A body whose members a handler can read in another order than sent
// ("quantity" and "Quantity": encoding/json keeps the last) is a request
// of its own: the retry with the members swapped is refused, not given the
// first order's response; resent byte for byte, it replays.
func TestJSONAmbiguousNames(t *testing.T) {
	t.Parallel()
	type order struct {
		Quantity int `json:"quantity"`
	}
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "quantity %d", o.Quantity)
	})
	first := e.Do(http.MethodPost, "/orders", "k", `{"quantity":1,"Quantity":1000}`)
	if first.Code != http.StatusCreated || first.Body.String() != "quantity 1000" {
		t.Fatalf("first: %d %q", first.Code, first.Body)
	}
	wantProblem(t, e.Do(http.MethodPost, "/orders", "k", `{"Quantity":1000,"quantity":1}`),
		http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
	again := e.Do(http.MethodPost, "/orders", "k", `{"quantity":1,"Quantity":1000}`)
	if again.Header().Get(idemhttp.HeaderReplayed) != "true" || again.Body.String() != "quantity 1000" {
		t.Fatalf("retry: %d %q", again.Code, again.Body)
	}
	e.WantCalls(1)
	if rec := e.Record("", "k"); string(rec.Response.Body) != "quantity 1000" {
		t.Fatalf("record body %q", rec.Response.Body)
	}
}

// Row: same key, different fingerprint (completed or in flight) → 422.
func TestMismatch(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, nil)
	e.Do(http.MethodPost, "/things", "k", `{"n":1}`)
	before := e.Record("", "k")
	for name, r := range map[string]*http.Request{
		"body":   request(http.MethodPost, "/things", "k", `{"n":2}`),
		"path":   request(http.MethodPost, "/other", "k", `{"n":1}`),
		"query":  request(http.MethodPost, "/things?x=1", "k", `{"n":1}`),
		"method": request(http.MethodPatch, "/things", "k", `{"n":1}`),
	} {
		t.Run(name, func(t *testing.T) {
			wantProblem(t, e.Serve(r), http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
		})
	}
	e.WantCalls(1)
	if after := e.Record("", "k"); after.Fingerprint != before.Fingerprint || after.Fence != before.Fence {
		t.Fatalf("record changed: %+v", after)
	}

	t.Run("in flight", func(t *testing.T) {
		release := make(chan struct{})
		started := make(chan struct{})
		e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			w.WriteHeader(http.StatusCreated)
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.Do(http.MethodPost, "/things", "k", `{"n":1}`)
		}()
		<-started
		wantProblem(t, e.Do(http.MethodPost, "/things", "k", `{"n":2}`), http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
		close(release)
		<-done
		e.WantCalls(1)
	})
}

// Row: retry while the first is in flight → 409 PROCESSING + Retry-After.
// 100 concurrent identical requests run the handler exactly once.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		echoHandler(w, r)
	})
	const n = 100
	var wg sync.WaitGroup
	responses := make([]*httptest.ResponseRecorder, n)
	for i := range n {
		wg.Go(func() { responses[i] = e.Do(http.MethodPost, "/things", "same", `{"n":1}`) })
	}
	wg.Wait()
	e.WantCalls(1)
	var created, processing int
	for _, w := range responses {
		switch w.Code {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			wantProblem(t, w, http.StatusConflict, idemhttp.CodeProcessing)
			if w.Header().Get("Retry-After") != "1" {
				t.Fatalf("409 without Retry-After: %v", w.Header())
			}
			processing++
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	if created < 1 || created+processing != n {
		t.Fatalf("%d created, %d processing", created, processing)
	}
}

// Row: … or, when the route allows waiting, wait and then replay.
func TestWaitReplays(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemhttp.Config{Wait: 10 * time.Second}, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		echoHandler(w, r)
	})
	const n = 100
	var wg sync.WaitGroup
	responses := make([]*httptest.ResponseRecorder, n)
	for i := range n {
		wg.Go(func() { responses[i] = e.Do(http.MethodPost, "/things", "same", `{"n":1}`) })
	}
	wg.Wait()
	e.WantCalls(1)
	firsts := 0
	for _, w := range responses {
		if w.Code != http.StatusCreated || w.Body.String() != `{"echo":"{\"n\":1}"}` {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		if w.Header().Get(idemhttp.HeaderReplayed) != "true" {
			firsts++
		}
	}
	if firsts != 1 {
		t.Fatalf("%d responses not marked replayed, want 1", firsts)
	}
}

// A waiter whose first request is released (5xx) runs the handler itself.
func TestWaitAfterRelease(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	var runs atomic.Int64
	e := setup(t, &idemhttp.Config{Wait: 10 * time.Second}, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			time.Sleep(50 * time.Millisecond)
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	first := make(chan int)
	go func() { first <- e.Do(http.MethodPost, "/things", "k", `{}`).Code }()
	<-started
	w := e.Do(http.MethodPost, "/things", "k", `{}`)
	if code := <-first; code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", code)
	}
	if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("waiter: %d, replayed %q", w.Code, w.Header().Get(idemhttp.HeaderReplayed))
	}
	e.WantCalls(2)
}

// With Wait, a first request that outlasts it still gets the waiter 409.
func TestWaitTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{})
	e := setup(t, &idemhttp.Config{Wait: 60 * time.Millisecond}, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	done := make(chan struct{})
	go func() { defer close(done); e.Do(http.MethodPost, "/things", "k", `{}`) }()
	<-started
	begin := time.Now()
	w := e.Do(http.MethodPost, "/things", "k", `{}`)
	if waited := time.Since(begin); waited < 60*time.Millisecond {
		t.Errorf("answered after %v, before Wait", waited)
	}
	wantProblem(t, w, http.StatusConflict, idemhttp.CodeProcessing)
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	close(release)
	<-done
	e.WantCalls(1)
}

// Row: handler answers 5xx, 408, 425 or 429 → released; a retry runs again
// (401, 403 and 407: TestReleasesAuthAnswers).
func TestReleasedStatuses(t *testing.T) {
	t.Parallel()
	for _, status := range []int{500, 502, 503, 408, 425, 429} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "3")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, "try again")
			})
			for i := 1; i <= 2; i++ {
				w := e.Do(http.MethodPost, "/things", "k", `{}`)
				if w.Code != status || w.Body.String() != "try again" || w.Header().Get("Retry-After") != "3" {
					t.Fatalf("status %d, body %q, header %v", w.Code, w.Body, w.Header())
				}
				e.WantCalls(int64(i))
				e.NoRecord("", "k")
			}
		})
	}
}

// Row: handler answers 401, 403 or 407 → released by default: they refuse
// the caller's credentials, and the retry with the header that was
// missing (or a refreshed token) runs the handler, where a replay would
// repeat the stale refusal for the record's retention.
func TestReleasesAuthAnswers(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			var effects atomic.Int32
			e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("X-User-ID") == "" {
					idemhttp.WriteProblem(w, status, "NO_USER", "Who are you", "send X-User-ID")
					return
				}
				effects.Add(1)
				w.WriteHeader(http.StatusCreated)
			})
			if w := e.Do(http.MethodPost, "/orders", "k", `{}`); w.Code != status {
				t.Fatalf("without credentials: status %d, want %d", w.Code, status)
			}
			e.NoRecord("", "k")
			withUser := func() *http.Request {
				r := request(http.MethodPost, "/orders", "k", `{}`)
				r.Header.Set("X-User-ID", "u1")
				return r
			}
			if w := e.Serve(withUser()); w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "" {
				t.Fatalf("with credentials: status %d, header %v; want 201, not replayed", w.Code, w.Header())
			}
			if w := e.Serve(withUser()); w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
				t.Fatalf("retry: status %d, header %v; want the 201 replayed", w.Code, w.Header())
			}
			if n := effects.Load(); n != 1 {
				t.Fatalf("%d effects, want 1", n)
			}
			e.WantCalls(2) // the refusal and the 201; the retry is a replay
		})
	}
}

// An answer that tells the client to try again (429, 503, an error status
// with Retry-After: an upstream's own 409 PROCESSING) is never stored,
// even under a policy that keeps every status; a 2xx with Retry-After is
// a definite answer, and is.
func TestTryAgainNeverStored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string // header name; "" sets none
		stored     bool
	}{
		{"409 PROCESSING with Retry-After", http.StatusConflict, "Retry-After", false},
		{"503", http.StatusServiceUnavailable, "", false},
		{"429", http.StatusTooManyRequests, "", false},
		{"500 with Retry-After", http.StatusInternalServerError, "Retry-After", false},
		{"400 with retry-after set as is", http.StatusBadRequest, "retry-after", false},
		{"409 without Retry-After", http.StatusConflict, "", true},
		{"500 without Retry-After", http.StatusInternalServerError, "", true},
		{"202 with Retry-After", http.StatusAccepted, "Retry-After", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, &idemhttp.Config{Release: func(int) bool { return false }}, func(w http.ResponseWriter, r *http.Request) {
				if tc.retryAfter != "" {
					w.Header()[tc.retryAfter] = []string{"1"}
				}
				idemhttp.WriteProblem(w, tc.status, idemhttp.CodeProcessing, "Processing", "still running")
			})
			for i := 1; i <= 2; i++ {
				w := e.Do(http.MethodPost, "/orders", "k", `{}`)
				if w.Code != tc.status {
					t.Fatalf("attempt %d: status %d, want %d", i, w.Code, tc.status)
				}
				if replayed := w.Header().Get(idemhttp.HeaderReplayed) == "true"; replayed != (tc.stored && i == 2) {
					t.Fatalf("attempt %d replayed: %v", i, replayed)
				}
			}
			if tc.stored {
				e.WantCalls(1)
				e.Record("", "k")
			} else {
				e.WantCalls(2)
				e.NoRecord("", "k")
			}
		})
	}
}

// Row: the release policy is configurable (keep 5xx, as Stripe does).
func TestReleasePolicyKeeps5xx(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemhttp.Config{Release: func(s int) bool { return s == 429 }}, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	})
	first := e.Do(http.MethodPost, "/things", "k", `{}`)
	replay := e.Do(http.MethodPost, "/things", "k", `{}`)
	if first.Code != 500 || replay.Code != 500 || replay.Body.String() != first.Body.String() ||
		replay.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("first %d %q, replay %d %q", first.Code, first.Body, replay.Code, replay.Body)
	}
	e.WantCalls(1)
	if rec := e.Record("", "k"); rec.Response.StatusCode != 500 {
		t.Fatalf("record %+v", rec)
	}
}

// Row: other 4xx → stored and replayed: the retry gets the same error.
func Test4xxStored(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 402, 404, 409, 422} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
				idemhttp.WriteProblem(w, status, "OUT_OF_STOCK", "Out of stock", "sku A-1 is sold out")
			})
			first := e.Do(http.MethodPost, "/things", "k", `{}`)
			replay := e.Do(http.MethodPost, "/things", "k", `{}`)
			if first.Code != status || replay.Code != status || replay.Body.String() != first.Body.String() ||
				replay.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("first %d, replay %d %v %s", first.Code, replay.Code, replay.Header(), replay.Body)
			}
			e.WantCalls(1)
			if rec := e.Record("", "k"); rec.Status != idem.StatusCompleted || rec.Response.StatusCode != status {
				t.Fatalf("record %+v", rec)
			}
		})
	}
}

// Row: handler panics → released, and the panic goes on.
func TestPanicReleases(t *testing.T) {
	t.Parallel()
	var boom = errors.New("boom")
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		panic(boom)
	})
	for i := 1; i <= 2; i++ {
		func() {
			defer func() {
				if v := recover(); v != boom {
					t.Fatalf("recovered %v, want the handler's panic", v)
				}
			}()
			w := e.Do(http.MethodPost, "/things", "k", `{}`)
			t.Fatalf("no panic; status %d", w.Code)
		}()
		e.WantCalls(int64(i))
		e.NoRecord("", "k")
	}

	// Through a real server, the client sees the connection fail.
	srv := httptest.NewUnstartedServer(e.Handler)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/things", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "k2")
	if resp, err := srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("status %d after a panic", resp.StatusCode)
	}
	e.NoRecord("", "k2")
}

// A handler that ends its execution itself (Abandon: the outcome is
// unknown) and then aborts the response (http.ErrAbortHandler, as
// httputil.ReverseProxy does when the upstream's answer breaks off): the
// record stays in flight as the handler left it, and the log does not say
// the key was released.
func TestPanicAfterAbandonKeepsTheRecord(t *testing.T) {
	t.Parallel()
	var logs obstest.LogBuffer
	e := setup(t, &idemhttp.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		idemhttp.ExecutionFrom(r.Context()).Abandon()
		panic(http.ErrAbortHandler)
	})
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		w := e.Do(http.MethodPost, "/things", "k", `{}`)
		t.Fatalf("no panic; status %d", w.Code)
	}()
	if rec := e.Record("", "k"); rec.Status != idem.StatusProcessing {
		t.Fatalf("record %+v; want it in flight, as the handler left it", rec)
	}
	w := e.Do(http.MethodPost, "/things", "k", `{}`)
	wantProblem(t, w, http.StatusConflict, idemhttp.CodeProcessing)
	e.WantCalls(1)
	if l := logs.String(); strings.Contains(l, "key released") {
		t.Fatalf("the log says the key was released:\n%s", l)
	}
}

// Row: store unreachable → 503 + Retry-After (fail closed); FailOpen runs
// the handler.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	store := &flakyStore{Store: memstore.New(nil)}
	store.acquire.Store(true)
	e := setup(t, &idemhttp.Config{Store: store}, nil)
	w := e.Do(http.MethodPost, "/things", "k", `{}`)
	wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.CodeStoreUnavailable)
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	e.WantCalls(0)

	// Validation errors stay 400 with the store down.
	wantProblem(t, e.Do(http.MethodPost, "/things", "", `{}`), http.StatusBadRequest, idemhttp.CodeMissingKey)

	t.Run("FailOpen", func(t *testing.T) {
		t.Parallel()
		store := &flakyStore{Store: memstore.New(nil)}
		store.acquire.Store(true)
		var exec *idem.Execution
		e := setup(t, &idemhttp.Config{Store: store, FailOpen: true}, func(w http.ResponseWriter, r *http.Request) {
			exec = idemhttp.ExecutionFrom(r.Context())
			echoHandler(w, r)
		})
		for i := 1; i <= 2; i++ {
			w := e.Do(http.MethodPost, "/things", "k", `{"n":1}`)
			if w.Code != http.StatusCreated || w.Body.String() != `{"echo":"{\"n\":1}"}` || exec != nil {
				t.Fatalf("status %d %s, execution %v", w.Code, w.Body, exec)
			}
			e.WantCalls(int64(i))
		}
	})
}

// When the completion cannot be stored, the client still gets the real
// response and the record is left to its lease (a retry gets 409).
func TestCompleteFails(t *testing.T) {
	t.Parallel()
	store := &flakyStore{Store: memstore.New(nil)}
	store.complete.Store(true)
	e := setup(t, &idemhttp.Config{Store: store}, nil)
	w := e.Do(http.MethodPost, "/things", "k", `{"n":1}`)
	if w.Code != http.StatusCreated || w.Body.String() != `{"echo":"{\"n\":1}"}` {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	if rec := e.Record("", "k"); rec.Status != idem.StatusProcessing {
		t.Fatalf("record %+v", rec)
	}
	wantProblem(t, e.Do(http.MethodPost, "/things", "k", `{"n":1}`), http.StatusConflict, idemhttp.CodeProcessing)
	e.WantCalls(1)
}

// Row: request body over the limit → 413, before any record.
func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemhttp.Config{MaxRequestBody: 10}, nil)
	w := e.Do(http.MethodPost, "/things", "k", `{"a":"123"}`) // 11 bytes
	wantProblem(t, w, http.StatusRequestEntityTooLarge, idemhttp.CodeBodyTooLarge)
	e.NoRecord("", "k")

	// Without a Content-Length, too.
	r := request(http.MethodPost, "/things", "k", "")
	r.Body = io.NopCloser(strings.NewReader(strings.Repeat("x", 11)))
	r.ContentLength = -1
	wantProblem(t, e.Serve(r), http.StatusRequestEntityTooLarge, idemhttp.CodeBodyTooLarge)
	e.NoRecord("", "k")
	e.WantCalls(0)

	// At the limit it passes, and the handler reads all of it.
	r = request(http.MethodPost, "/things", "k", "")
	r.Body = io.NopCloser(strings.NewReader(`{"a":"12"}`))
	r.ContentLength = -1
	if w := e.Serve(r); w.Code != http.StatusCreated || w.Body.String() != `{"echo":"{\"a\":\"12\"}"}` {
		t.Fatalf("status %d %s", w.Code, w.Body)
	}
	e.WantCalls(1)
}

// Row: response too large to keep → the client gets it; the record keeps
// status and headers and the marker; a retry never runs the effect again.
func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("0123456789", 10)
	e := setup(t, &idemhttp.Config{MaxResponseBody: 16}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusCreated)
		for i := 0; i < len(big); i += 7 {
			_, _ = io.WriteString(w, big[i:min(i+7, len(big))])
		}
	})
	first := e.Do(http.MethodPost, "/things", "k", `{}`)
	if first.Code != http.StatusCreated || first.Body.String() != big {
		t.Fatalf("first: %d %q", first.Code, first.Body)
	}
	rec := e.Record("", "k")
	if rec.Status != idem.StatusCompleted || !rec.Response.BodyOmitted || len(rec.Response.Body) != 0 ||
		rec.Response.StatusCode != http.StatusCreated || rec.Response.Header["Content-Type"][0] != "text/plain" {
		t.Fatalf("record response %+v", rec.Response)
	}
	replay := e.Do(http.MethodPost, "/things", "k", `{}`)
	if replay.Code != http.StatusCreated || replay.Body.Len() != 0 ||
		replay.Header().Get(idemhttp.HeaderBodyOmitted) != "true" ||
		replay.Header().Get(idemhttp.HeaderReplayed) != "true" ||
		replay.Header().Get("Content-Type") != "text/plain" ||
		replay.Header().Get("Content-Length") != "" {
		t.Fatalf("replay: %d %v %q", replay.Code, replay.Header(), replay.Body)
	}
	e.WantCalls(1)
}

// Flush sends what was written and streams the rest; the record keeps the
// body while it fits, else marks it omitted.
func TestFlushStreams(t *testing.T) {
	t.Parallel()
	for name, limit := range map[string]int64{"kept": 0, "omitted": 8} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var underlying *httptest.ResponseRecorder
			var sawBeforeEnd string
			e := setup(t, &idemhttp.Config{MaxResponseBody: limit}, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: 1\n\n")
				if err := http.NewResponseController(w).Flush(); err != nil {
					t.Errorf("Flush: %v", err)
				}
				sawBeforeEnd = underlying.Body.String()
				_, _ = io.WriteString(w, "data: 2\n\n")
			})
			underlying = httptest.NewRecorder()
			e.Handler.ServeHTTP(underlying, request(http.MethodPost, "/events", "k", `{}`))
			if sawBeforeEnd != "data: 1\n\n" || !underlying.Flushed {
				t.Fatalf("before the handler returned the client had %q (flushed %v)", sawBeforeEnd, underlying.Flushed)
			}
			if underlying.Code != 200 || underlying.Body.String() != "data: 1\n\ndata: 2\n\n" {
				t.Fatalf("client got %d %q", underlying.Code, underlying.Body)
			}
			rec := e.Record("", "k")
			if name == "kept" && (rec.Response.BodyOmitted || string(rec.Response.Body) != "data: 1\n\ndata: 2\n\n") {
				t.Fatalf("record %+v", rec.Response)
			}
			if name == "omitted" && (!rec.Response.BodyOmitted || len(rec.Response.Body) != 0) {
				t.Fatalf("record %+v", rec.Response)
			}
			replay := e.Do(http.MethodPost, "/events", "k", `{}`)
			if replay.Code != 200 || replay.Header().Get("Content-Type") != "text/event-stream" {
				t.Fatalf("replay %d %v", replay.Code, replay.Header())
			}
			e.WantCalls(1)
		})
	}
}

// Flushing through a real server reaches the client before the handler
// returns.
func TestFlushRealServer(t *testing.T) {
	t.Parallel()
	proceed := make(chan struct{})
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-proceed
		_, _ = io.WriteString(w, "second\n")
	})
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/s", nil)
	req.Header.Set("Idempotency-Key", "k")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, line); err != nil || string(line) != "first\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	close(proceed)
	rest, _ := io.ReadAll(resp.Body)
	if string(rest) != "second\n" {
		t.Fatalf("rest %q", rest)
	}
}

// Hijack: the record completes with the status written before (200 if
// none) and no body, so a retry never runs the handler again.
func TestHijack(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		_ = brw.Flush()
	})
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	post := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/h", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := post()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hi" {
		t.Fatalf("first: %d %q", resp.StatusCode, body)
	}
	// The handler answered on the connection itself, so the record
	// completes only after the client has the answer.
	rec := e.Record("", "k")
	for deadline := time.Now().Add(5 * time.Second); rec.Status != idem.StatusCompleted && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		rec = e.Record("", "k")
	}
	if rec.Status != idem.StatusCompleted || !rec.Response.BodyOmitted || rec.Response.StatusCode != 200 {
		t.Fatalf("record %+v %+v", rec, rec.Response)
	}
	resp = post()
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(body) != 0 || resp.Header.Get(idemhttp.HeaderBodyOmitted) != "true" {
		t.Fatalf("replay: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	e.WantCalls(1)
}

// Lease lost: the handler's context is cancelled with cause ErrLeaseLost,
// its completion is refused, so the takeover's response stands, and its
// client gets what a retry would get at that moment (never the losing
// execution's own response, which no retry replays): the winner's
// response, replayed, or 409 PROCESSING. Only once the losing response
// has started (Flush) does its client get it.
func TestLeaseLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// before runs while the first handler waits, after its lease was
		// lost on the store's clock and before its context ends; it
		// returns a function to run after the first request's answer.
		before func(t *testing.T, e *env, clock *fakeClock) (after func())
		// flush: the first handler flushes its response before it waits.
		flush bool
		// flushLate: the first handler flushes its response after its
		// context said the lease was lost (hijackLate: hijacks then).
		flushLate, hijackLate bool
		// self: the first handler completes the execution itself, then
		// answers 500.
		self     bool
		status   int
		body     string // of the first request's answer
		replayed bool
		warn     string // logged
		runs     int64  // of the handler; 0 means 2
	}{{
		name: "winner completed",
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			if w := e.Do(http.MethodPost, "/things", "k", `{}`); w.Code != http.StatusCreated || w.Body.String() != "second" {
				t.Errorf("takeover: %d %q", w.Code, w.Body)
			}
			return nil
		},
		status: http.StatusCreated, body: "second", replayed: true,
		warn: "the response of the execution that took the key over",
	}, {
		name: "winner completed, handler completes itself",
		self: true,
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			e.Do(http.MethodPost, "/things", "k", `{}`)
			return nil
		},
		status: http.StatusCreated, body: "second", replayed: true,
		warn: "the response of the execution that took the key over",
	}, {
		name: "winner still running",
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			done := make(chan *httptest.ResponseRecorder)
			e.Block = make(chan struct{})
			e.Blocked = make(chan struct{})
			go func() { done <- e.Do(http.MethodPost, "/things", "k", `{}`) }()
			<-e.Blocked
			return func() {
				close(e.Block)
				if w := <-done; w.Code != http.StatusCreated || w.Body.String() != "second" {
					t.Errorf("takeover: %d %q", w.Code, w.Body)
				}
			}
		},
		status: http.StatusConflict, body: `"code":"PROCESSING"`,
		warn: "took the key over still runs",
	}, {
		name: "record gone",
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			if err := e.Store.Delete(context.Background(), "", "k"); err != nil {
				t.Error(err)
			}
			return nil
		},
		status: http.StatusConflict, body: `"code":"PROCESSING"`,
		warn: "record not found", runs: 1,
	}, {
		name: "key taken by another request",
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			if err := e.Store.Delete(context.Background(), "", "k"); err != nil {
				t.Error(err)
			}
			if w := e.Do(http.MethodPost, "/things", "k", `{"other":1}`); w.Code != http.StatusCreated {
				t.Errorf("takeover: %d %q", w.Code, w.Body)
			}
			return nil
		},
		status: http.StatusConflict, body: `"code":"PROCESSING"`,
		warn: "key taken by another request",
	}, {
		name:      "flushed after the lease was lost",
		flushLate: true,
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			e.Do(http.MethodPost, "/things", "k", `{}`)
			return nil
		},
		status: http.StatusCreated, body: "second", replayed: true,
		warn: "the response of the execution that took the key over",
	}, {
		name:       "hijacked after the lease was lost",
		hijackLate: true,
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			e.Do(http.MethodPost, "/things", "k", `{}`)
			return nil
		},
		status: http.StatusCreated, body: "second", replayed: true,
		warn: "the response of the execution that took the key over",
	}, {
		name:  "response already started",
		flush: true,
		before: func(t *testing.T, e *env, clock *fakeClock) func() {
			e.Do(http.MethodPost, "/things", "k", `{}`)
			return nil
		},
		status: http.StatusCreated, body: "first",
		warn: "response had started",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			store := &flakyStore{Store: memstore.New(&memstore.Config{Now: clock.Now})}
			var logs obstest.LogBuffer
			started, proceed := make(chan struct{}), make(chan struct{})
			var cause error
			var owner string
			var calls atomic.Int64
			var e *env
			e = setup(t, &idemhttp.Config{
				Store: store, Lease: 30 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			}, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) > 1 {
					if e.Block != nil {
						close(e.Blocked)
						<-e.Block
					}
					w.Header().Set("X-Second", "1")
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, "second")
					return
				}
				w.Header().Set("X-First", "1")
				w.Header().Set("Set-Cookie", "first=1")
				if tc.flush {
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, "first")
					http.NewResponseController(w).Flush()
				}
				owner = idemhttp.ExecutionFrom(r.Context()).Lease().Owner
				store.noExtend.Store(&owner) // the watchdog cannot renew: the lease ends
				close(started)
				<-r.Context().Done()
				cause = context.Cause(r.Context())
				<-proceed
				if tc.self {
					err := idemhttp.ExecutionFrom(r.Context()).Complete(context.Background(), idem.Response{StatusCode: http.StatusCreated})
					if !errors.Is(err, idem.ErrLeaseLost) {
						t.Errorf("Complete: %v, want ErrLeaseLost", err)
					}
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				if tc.hijackLate {
					if _, _, err := http.NewResponseController(w).Hijack(); !errors.Is(err, idem.ErrLeaseLost) {
						t.Errorf("Hijack after the lease was lost: %v, want ErrLeaseLost", err)
					}
				}
				if !tc.flush {
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, "first")
				}
				if tc.flushLate {
					if err := http.NewResponseController(w).Flush(); !errors.Is(err, idem.ErrLeaseLost) {
						t.Errorf("Flush after the lease was lost: %v, want ErrLeaseLost", err)
					}
				}
			})
			first := make(chan *httptest.ResponseRecorder)
			go func() {
				w := httptest.NewRecorder()
				w.Header().Set("X-Outer", "set around the middleware")
				e.Handler.ServeHTTP(w, request(http.MethodPost, "/things", "k", `{}`))
				first <- w
			}()
			<-started
			clock.Advance(time.Minute) // the first lease ends on the store's clock
			after := tc.before(t, e, clock)
			close(proceed)
			w := <-first
			if after != nil {
				after()
			}

			if !errors.Is(cause, idem.ErrLeaseLost) {
				t.Errorf("first handler's context cause %v, want ErrLeaseLost", cause)
			}
			if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.body) {
				t.Errorf("first: %d %q, want %d %q", w.Code, w.Body, tc.status, tc.body)
			}
			if got := w.Header().Get(idemhttp.HeaderReplayed) == "true"; got != tc.replayed {
				t.Errorf("first: replayed %v, want %v", got, tc.replayed)
			}
			if tc.status == http.StatusConflict && w.Header().Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After: %v", w.Header())
			}
			if !tc.flush && (w.Header().Get("X-First") != "" || w.Header().Get("Set-Cookie") != "") {
				t.Errorf("first: the losing handler's headers were sent: %v", w.Header())
			}
			if w.Header().Get("X-Outer") == "" {
				t.Errorf("first: the header set around the middleware is gone: %v", w.Header())
			}
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), tc.warn) {
				t.Errorf("log %q, want a warning with %q", logs.String(), tc.warn)
			}
			if rec, err := e.Store.Get(context.Background(), "", "k"); err == nil && rec.Owner == owner {
				t.Errorf("the stale execution's response was stored: %+v", rec)
			}
			if want := cmp.Or(tc.runs, 2); calls.Load() != want {
				t.Errorf("handler ran %d times, want %d", calls.Load(), want)
			}
		})
	}
}

// Scopes isolate callers; scope errors answer before anything is stored.
func TestScope(t *testing.T) {
	t.Parallel()
	scopeFn := func(r *http.Request) (string, error) {
		switch u := r.Header.Get("X-User"); u {
		case "":
			return "", errors.New("no user")
		case "banned":
			return "", &idemhttp.ScopeError{Status: http.StatusForbidden, Code: "FORBIDDEN", Detail: "banned"}
		default:
			return "user:" + u, nil
		}
	}
	e := setup(t, &idemhttp.Config{Scope: scopeFn}, nil)
	as := func(user string) *httptest.ResponseRecorder {
		r := request(http.MethodPost, "/things", "k", `{}`)
		if user != "" {
			r.Header.Set("X-User", user)
		}
		return e.Serve(r)
	}
	if as("alice").Header().Get(idemhttp.HeaderReplayed) != "" || as("bob").Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatal("one user's key replayed for another")
	}
	if as("alice").Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatal("no replay within a scope")
	}
	e.WantCalls(2)
	e.Record("user:alice", "k")
	e.Record("user:bob", "k")
	e.NoRecord("", "k")

	wantProblem(t, as(""), http.StatusUnauthorized, idemhttp.CodeUnauthenticated)
	w := as("banned")
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), `"code":"FORBIDDEN"`) ||
		!strings.Contains(w.Body.String(), `"type":"about:blank"`) {
		t.Fatalf("banned: %d %s", w.Code, w.Body)
	}
	wantProblem(t, as("bad\x00user"), http.StatusBadRequest, idemhttp.CodeInvalidScope)
	e.WantCalls(2)
}

// The handler sees its execution and a fresh body; the incoming request is
// not changed.
func TestHandlerSeesExecution(t *testing.T) {
	t.Parallel()
	var lease idem.Lease
	var body []byte
	var cl int64
	e := setup(t, &idemhttp.Config{Scope: func(*http.Request) (string, error) { return "t1", nil }}, func(w http.ResponseWriter, r *http.Request) {
		if exec := idemhttp.ExecutionFrom(r.Context()); exec != nil {
			lease = exec.Lease()
		}
		body, _ = io.ReadAll(r.Body)
		cl = r.ContentLength
		w.WriteHeader(http.StatusNoContent)
	})
	r := request(http.MethodPost, "/things", "k", "")
	r.Body = io.NopCloser(strings.NewReader(`{"x":true}`))
	r.ContentLength = -1
	origBody, origCtx := r.Body, r.Context()
	w := e.Serve(r)
	if w.Code != http.StatusNoContent || lease.Scope != "t1" || lease.Key != "k" || lease.Fence != 1 {
		t.Fatalf("status %d, lease %+v", w.Code, lease)
	}
	if string(body) != `{"x":true}` || cl != int64(len(body)) {
		t.Fatalf("handler body %q, ContentLength %d", body, cl)
	}
	if r.Body != origBody || r.Context() != origCtx || r.ContentLength != -1 {
		t.Fatal("the incoming request was changed")
	}
	if idemhttp.ExecutionFrom(context.Background()) != nil {
		t.Fatal("ExecutionFrom outside a guarded request")
	}
}

// A handler that writes nothing is stored as 200 with no body; a sniffed
// Content-Type is stored so the replay matches the first response.
func TestImplicitStatusAndSniffing(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/html" {
			_, _ = io.WriteString(w, "<html><body>ok</body></html>")
		}
	})
	w := e.Do(http.MethodPost, "/empty", "k1", `{}`)
	replay := e.Do(http.MethodPost, "/empty", "k1", `{}`)
	if w.Code != 200 || replay.Code != 200 || replay.Body.Len() != 0 {
		t.Fatalf("empty: %d, replay %d %q", w.Code, replay.Code, replay.Body)
	}
	w = e.Do(http.MethodPost, "/html", "k2", `{}`)
	replay = e.Do(http.MethodPost, "/html", "k2", `{}`)
	if ct := w.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" || replay.Header().Get("Content-Type") != ct {
		t.Fatalf("first %q, replay %q", ct, replay.Header().Get("Content-Type"))
	}
	e.WantCalls(2)
}

// Header changes after WriteHeader are ignored, as in net/http.
func TestHeaderAfterWriteHeader(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusAccepted)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/late")
		_, _ = io.WriteString(w, "accepted")
	})
	first := e.Do(http.MethodPost, "/x", "k", `{}`)
	replay := e.Do(http.MethodPost, "/x", "k", `{}`)
	for _, w := range []*httptest.ResponseRecorder{first, replay} {
		if w.Code != http.StatusAccepted || w.Header().Get("Content-Type") != "text/plain" || w.Header().Get("Location") != "" {
			t.Fatalf("%d %v", w.Code, w.Header())
		}
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	store := memstore.New(nil)
	for name, cfg := range map[string]*idemhttp.Config{
		"nil config":          nil,
		"nil store":           {},
		"negative request":    {Store: store, MaxRequestBody: -1},
		"negative response":   {Store: store, MaxResponseBody: -1},
		"negative wait":       {Store: store, Wait: -time.Second},
		"negative lease":      {Store: store, Lease: -time.Second},
		"negative retention":  {Store: store, Retention: -time.Second},
		"negative max exec":   {Store: store, MaxExecution: -time.Second},
		"tiny lease":          {Store: store, Lease: time.Millisecond},
		"empty method":        {Store: store, Methods: []string{""}},
		"method with space":   {Store: store, Methods: []string{"PO ST"}},
		"lower-case method":   {Store: store, Methods: []string{"post"}},
		"bad header name":     {Store: store, ReplayHeaders: []string{"X Y"}},
		"Set-Cookie":          {Store: store, ReplayHeaders: []string{"set-cookie"}},
		"Authorization":       {Store: store, ReplayHeaders: []string{"Authorization"}},
		"Connection":          {Store: store, ReplayHeaders: []string{"Connection"}},
		"Proxy-Authenticate":  {Store: store, ReplayHeaders: []string{"Proxy-Authenticate"}},
		"Transfer-Encoding":   {Store: store, ReplayHeaders: []string{"Transfer-Encoding"}},
		"Upgrade":             {Store: store, ReplayHeaders: []string{"Upgrade"}},
		"Idempotent-Replayed": {Store: store, ReplayHeaders: []string{"Idempotent-Replayed"}},
	} {
		if _, err := idemhttp.New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	if _, err := idemhttp.New(&idemhttp.Config{Store: store, Methods: []string{"PUT", "PURGE"}, ReplayHeaders: []string{"X-Rate-Limit"}}); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
}

// With derives a per-route middleware; the original keeps its config.
func TestWith(t *testing.T) {
	t.Parallel()
	base := setup(t, nil, nil)
	lax, err := base.Middleware.With(func(c *idemhttp.Config) { c.KeyOptional = true })
	if err != nil {
		t.Fatal(err)
	}
	h := lax.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, request(http.MethodPost, "/x", "", `{}`))
	if w.Code != http.StatusCreated {
		t.Fatalf("derived: %d", w.Code)
	}
	wantProblem(t, base.Do(http.MethodPost, "/x", "", `{}`), http.StatusBadRequest, idemhttp.CodeMissingKey)
	if _, err := base.Middleware.With(func(c *idemhttp.Config) { c.Wait = -1 }); err == nil {
		t.Fatal("With accepted a bad config")
	}
}

// A retry after the record's retention runs the handler again.
func TestRetention(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	e := setup(t, &idemhttp.Config{Store: memstore.New(&memstore.Config{Now: clock.Now}), Retention: time.Hour}, nil)
	e.Do(http.MethodPost, "/x", "k", `{}`)
	e.Do(http.MethodPost, "/x", "k", `{}`)
	e.WantCalls(1)
	clock.Advance(time.Hour + time.Second)
	if w := e.Do(http.MethodPost, "/x", "k", `{}`); w.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatal("replayed an expired record")
	}
	e.WantCalls(2)
}

// Informational responses go out at once; trailers reach the client.
func TestEarlyHintsAndTrailers(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Checksum", "abc")
	})
	srv := httptest.NewServer(e.Handler)
	defer srv.Close()
	var hints []int
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error { hints = append(hints, code); return nil },
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/x", nil)
	req.Header.Set("Idempotency-Key", "k")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(body) != "body" || resp.Trailer.Get("X-Checksum") != "abc" {
		t.Fatalf("%d %q trailer %v", resp.StatusCode, body, resp.Trailer)
	}
	if len(hints) != 1 || hints[0] != http.StatusEarlyHints {
		t.Fatalf("1xx responses %v", hints)
	}
	if rec := e.Record("", "k"); rec.Response.StatusCode != http.StatusCreated || string(rec.Response.Body) != "body" {
		t.Fatalf("record %+v", rec.Response)
	}
}

// hangingGetStore answers Get only when its context ends: a store that
// stalls while a retry waits.
type hangingGetStore struct{ idem.Store }

func (s hangingGetStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	<-ctx.Done()
	return idem.Record{}, ctx.Err()
}

// Wait mode: a store that stalls while a retry polls it is bounded by
// StoreTimeout, and the retry is answered 503, not held for the whole Wait.
func TestWaitStoreStalls(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{})
	e := setup(t, &idemhttp.Config{Store: hangingGetStore{memstore.New(nil)}, Wait: time.Minute, StoreTimeout: 50 * time.Millisecond},
		func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-release
			w.WriteHeader(http.StatusCreated)
		})
	done := make(chan struct{})
	go func() { defer close(done); e.Do(http.MethodPost, "/things", "k", `{}`) }()
	<-started
	finished := make(chan *httptest.ResponseRecorder)
	go func() { finished <- e.Do(http.MethodPost, "/things", "k", `{}`) }()
	select {
	case w := <-finished:
		wantProblem(t, w, http.StatusServiceUnavailable, idemhttp.CodeStoreUnavailable)
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting retry was held far past StoreTimeout")
	}
	close(release)
	<-done
	e.WantCalls(1)
}

// A handler that cannot tell whether its effect happened abandons the
// execution: its answer reaches the client, the record is neither stored
// nor released, retries get 409 until the lease ends (it is no longer
// renewed), and a retry after that runs the handler again. The store's
// clock is a fake one, so the lease ends when the test says, however
// slowly a loaded machine runs it.
func TestHandlerAbandons(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	clock := newFakeClock()
	var abandon atomic.Bool
	abandon.Store(true)
	e := setup(t, &idemhttp.Config{Store: memstore.New(&memstore.Config{Now: clock.Now}), Lease: lease}, func(w http.ResponseWriter, r *http.Request) {
		if abandon.Load() {
			idemhttp.ExecutionFrom(r.Context()).Abandon()
			idemhttp.WriteProblem(w, http.StatusBadGateway, "UPSTREAM_OUTCOME_UNKNOWN", "Outcome unknown", "no answer")
			return
		}
		_, _ = io.WriteString(w, "done")
	})
	first := e.Do(http.MethodPost, "/things", "k", `{}`)
	wantProblem(t, first, http.StatusBadGateway, "UPSTREAM_OUTCOME_UNKNOWN")
	rec := e.Record("", "k")
	if rec.Status != idem.StatusProcessing || rec.Response != nil {
		t.Fatalf("record after Abandon: %+v; want processing, no response", rec)
	}
	wantProblem(t, e.Do(http.MethodPost, "/things", "k", `{}`), http.StatusConflict, idemhttp.CodeProcessing)
	e.WantCalls(1)

	// The watchdog stopped with Abandon: halfway through the lease on
	// the store's clock, and after a whole lease of real time, in which a
	// running watchdog would have renewed it (moved it on from the
	// store's now), the record holds the lease as it was.
	clock.Advance(lease / 2)
	time.Sleep(lease)
	if got := e.Record("", "k"); got.Status != idem.StatusProcessing || !got.LeaseUntil.Equal(rec.LeaseUntil) {
		t.Fatalf("record after a lease: %+v; want processing until %v (not renewed)", got, rec.LeaseUntil)
	}
	wantProblem(t, e.Do(http.MethodPost, "/things", "k", `{}`), http.StatusConflict, idemhttp.CodeProcessing)

	abandon.Store(false)
	clock.Advance(lease / 2) // the lease ends
	if w := e.Do(http.MethodPost, "/things", "k", `{}`); w.Code != http.StatusOK || w.Body.String() != "done" {
		t.Fatalf("retry after the lease: %d %q; want 200 \"done\"", w.Code, w.Body)
	}
	e.WantCalls(2)
	if got := e.Record("", "k"); got.Status != idem.StatusCompleted || got.Fence != rec.Fence+1 {
		t.Fatalf("record after the takeover: %+v; want completed at fence %d", got, rec.Fence+1)
	}
}
