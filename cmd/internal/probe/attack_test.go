package probe_test

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/probe"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
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

// TestMismatchOtherBodiesRefused: an API that validates its payload
// ahead of the idempotency layer and accepts only the probe's body (any
// other is 400 whatever its key, unknown members included) holds the draft; the probe cannot judge
// the key's refusal of another body, and says so (n/a) instead of
// failing the API for the validation's 400, in mismatch-422 and in
// concurrent-mismatch.
func TestMismatchOtherBodiesRefused(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var created atomic.Int64
	guarded := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if body, _ := io.ReadAll(r.Body); strings.Contains(string(body), "refuse") {
			idemhttp.WriteProblem(w, http.StatusBadRequest, "REFUSED", "Refused", "no such item")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, created.Add(1))
	}))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var order struct {
			Item string          `json:"item"`
			Qty  json.RawMessage `json:"qty"`
		}
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&order); err != nil || order.Item != "book" && order.Item != "refuse" || string(order.Qty) != "1" {
			http.Error(w, "only a book, once", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		guarded.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, `{"count":%d}`, created.Load()) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cfg := fakeConfig(srv.URL)
	cfg.OtherHeader, cfg.ServerErrorBody = nil, nil
	rep := run(t, cfg)
	na := slices.DeleteFunc(statuses(rep, probe.NotApplicable), func(id string) bool { return slices.Contains(scheduled, id) })
	if failed := statuses(rep, probe.Fail); len(failed) != 0 || !rep.CoreOK ||
		!slices.Equal(na, []string{"after-mismatch", "expiry", "mismatch-422", "private-headers", "released-5xx", "scoped-keys"}) {
		logReport(t, rep)
		t.Fatalf("failed %q, n/a %q; want no failure, mismatch-422 and after-mismatch n/a", failed, na)
	}
	if rep.Effect.After != created.Load() || rep.Effect.Expected != created.Load() {
		t.Errorf("effect %+v; the handler created %d", rep.Effect, created.Load())
	}
}

// storingAPI is an idempotent API that stores every header of an
// execution's answer and replays them all (marked a replay): POST /api
// creates an item, 201 {"id": n}, with the headers set(n, h) sets; keys
// are scoped to X-User; GET /count counts.
func storingAPI(t *testing.T, set func(n int64, h http.Header)) string {
	t.Helper()
	type stored struct {
		header http.Header
		body   string
	}
	var mu sync.Mutex
	records := map[string]*stored{}
	var created atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if key == "" || strings.ContainsFunc(key, func(r rune) bool { return r < ' ' }) || len(key) > 255 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"title":"Bad key","status":400}`)
			return
		}
		key = r.Header.Get("X-User") + "\x00" + strings.Trim(key, `"`)
		mu.Lock()
		defer mu.Unlock()
		if rec := records[key]; rec != nil {
			maps.Copy(w.Header(), rec.header)
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, rec.body)
			return
		}
		n := created.Add(1)
		h := http.Header{"Content-Type": {"application/json"}}
		set(n, h)
		rec := &stored{header: h, body: fmt.Sprintf(`{"id":%d}`, n)}
		records[key] = rec
		maps.Copy(w.Header(), h)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, rec.body)
	})
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, `{"count":%d}`, created.Load()) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPrivateHeadersLeaked: a replay that carries what its execution set
// for its caller alone fails private-headers, however the header is
// written: among other cookies, folded into one line with them, as
// Set-Cookie2, or as Authentication-Info.
func TestPrivateHeadersLeaked(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		set  func(n int64, h http.Header)
	}{
		{"among cookies", func(n int64, h http.Header) {
			h["Set-Cookie"] = []string{"lang=en; Path=/", fmt.Sprintf("sid=s%d; Path=/; HttpOnly", n), "theme=dark"}
		}},
		{"folded", func(n int64, h http.Header) {
			h.Set("Set-Cookie", fmt.Sprintf("lang=en; Path=/; Expires=Wed, 21 Oct 2037 07:28:00 GMT, sid=s%d; Path=/; HttpOnly", n))
		}},
		{"Set-Cookie2", func(n int64, h http.Header) { h.Set("Set-Cookie2", fmt.Sprintf(`sid="s%d"; Version="1"`, n)) }},
		{"Authentication-Info", func(n int64, h http.Header) {
			h.Set("Authentication-Info", fmt.Sprintf(`nextnonce="n%d", qop=auth`, n))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			base := storingAPI(t, c.set)
			cfg := fakeConfig(base)
			cfg.RefusedBody, cfg.ServerErrorBody = nil, nil
			rep := run(t, cfg)
			for _, r := range rep.Checks {
				if r.ID == "private-headers" && r.Status != probe.Fail {
					t.Errorf("private-headers %s: %s", r.Status, r.Reason)
				}
			}
			if rep.CoreOK {
				t.Errorf("core OK")
			}
		})
	}
}

// TestGetAnswersLikePost: an API whose POST answers {"status":"ok"}, as
// every GET it serves does, serves no GET from a POST's record: a GET
// with the POST's key that gets the same answer as a GET with a fresh key
// passes get-untouched (it failed, the core with it, for bytes the GET
// gets whatever its key).
func TestGetAnswersLikePost(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /api", mw.Handler(http.HandlerFunc(ok)))
	mux.HandleFunc("GET /", ok)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	rep := run(t, &probe.Config{URL: srv.URL + "/api", Body: []byte(fakeBody)})
	for _, r := range rep.Checks {
		if r.ID == "get-untouched" && r.Status != probe.Pass {
			t.Errorf("get-untouched %s: %s", r.Status, r.Reason)
		}
	}
	if !rep.CoreOK {
		logReport(t, rep)
		t.Errorf("core failed")
	}
}

// TestExpiryEarlyByLittle: records that end 15% before the retention the
// API documents (3 s of 20 s) let a retry late in the retention execute
// twice: the expiry check sends the key again close enough to the
// retention's end to see it (it sent it at four fifths of the retention,
// and passed the API). The check sends it a second and twice the first
// request's time before the end: this holds while that request takes
// less than a second.
func TestExpiryEarlyByLittle(t *testing.T) {
	t.Parallel()
	const retention = 20 * time.Second
	_, base := startFake(t, knobs{retention: retention, expireBy: retention * 15 / 100})
	cfg := fakeConfig(base)
	cfg.Retention = retention
	rep := run(t, cfg)
	for _, r := range rep.Checks {
		if r.ID == "expiry" && (r.Status != probe.Fail || !strings.Contains(r.Reason, "ended early")) {
			logReport(t, rep)
			t.Fatalf("expiry %s: %s; want a failure saying the record ended early", r.Status, r.Reason)
		}
	}
	if rep.CoreOK {
		t.Errorf("core OK")
	}
}

// TestLargeAnswers: an API whose answers are 4 MiB each, with the id of
// the execution at their end. The probe compares answers by all their
// bytes (a retry's answer that differs only after the first 4 MiB is an
// execution), but holds no answer whole: a run that reads some 300 MiB
// of answers allocates less than 64 MiB (it held each answer, and -n
// 1000 concurrent answers of up to 16 MiB each could take the machine's
// memory). Not parallel: it measures the allocations of the run alone.
func TestLargeAnswers(t *testing.T) {
	pad := []byte(`{"pad":"` + strings.Repeat("a", 4<<20) + `"`)
	var created atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(pad)
		fmt.Fprintf(w, `,"id":%d}`, created.Add(1))
	}))
	t.Cleanup(srv.Close)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rep := run(t, &probe.Config{URL: srv.URL + "/api", Body: []byte(fakeBody)})
	runtime.ReadMemStats(&after)
	for _, r := range rep.Checks {
		if (r.ID == "retry-replay" || r.ID == "concurrent") && r.Status != probe.Fail {
			t.Errorf("%s %s: %s; want a failure: every answer is an execution of its own", r.ID, r.Status, r.Reason)
		}
	}
	read := created.Load() * int64(len(pad))
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 || read < 100<<20 {
		t.Errorf("the run read %d MiB of answers and allocated %d MiB", read>>20, alloc>>20)
	}
}

// TestHeaderNamesAsWritten: a Config's headers written in lower case (a
// map literal, as HTTP/2 spells them) are the headers of those names: a
// body's Content-Type is the one given, not one added beside it, and the
// second caller's X-User replaces the first's instead of going with it.
func TestHeaderNamesAsWritten(t *testing.T) {
	t.Parallel()
	f, _ := startFake(t, knobs{})
	var mu sync.Mutex
	var bad []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if ct := r.Header.Values("Content-Type"); r.Method == http.MethodPost && !slices.Equal(ct, []string{"application/json; charset=utf-8"}) {
			bad = append(bad, fmt.Sprintf("Content-Type %q", ct))
		}
		if u := r.Header.Values("X-User"); len(u) != 1 {
			bad = append(bad, fmt.Sprintf("X-User %q", u))
		}
		mu.Unlock()
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := fakeConfig(srv.URL)
	cfg.Header = http.Header{"x-user": {"probe"}, "content-type": {"application/json; charset=utf-8"}}
	cfg.OtherHeader = http.Header{"x-user": {"other"}}
	cfg.EffectHeader = http.Header{"x-user": {"probe"}}
	rep := run(t, cfg)
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 || !rep.CoreOK {
		logReport(t, rep)
		t.Errorf("core OK %v; the API got %q", rep.CoreOK, first3(bad))
	}
}

func first3(s []string) []string { return s[:min(3, len(s))] }

// TestScopedEffectOfTheFirstCaller: an effect that only the first caller
// may read (its own orders, at a URL that names it) cannot be read as
// the second caller. The scoped-keys check then judges the second
// caller by its answers, reading the effect as the first caller; it
// failed the core with "give -H2 headers the effect's URL accepts", which
// no -H2 can do. A key space shared between callers still fails.
func TestScopedEffectOfTheFirstCaller(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		k      knobs
		status probe.Status
		other  int // the second caller's executions: its own key's, and the first caller's key's unless it leaked
	}{
		{"keys scoped", knobs{countPerUser: true}, probe.Pass, 2},
		{"keys shared, replays unmarked", knobs{countPerUser: true, globalKeys: true, noReplayHeader: true}, probe.Fail, 1},
	} {
		f, _ := startFake(t, c.k)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/count" && r.Header.Get("X-User") != "probe" {
				http.Error(w, "not your orders", http.StatusForbidden)
				return
			}
			f.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		rep := run(t, fakeConfig(srv.URL))
		for _, r := range rep.Checks {
			if r.ID == "scoped-keys" && (r.Status != c.status || r.OtherExecutions != c.other) {
				logReport(t, rep)
				t.Errorf("%s: scoped-keys %s, %d executions of the second caller: %s; want %s, %d", c.name, r.Status, r.OtherExecutions, r.Reason, c.status, c.other)
			}
			if r.EffectDelta == nil || *r.EffectDelta != int64(r.Executions) {
				t.Errorf("%s: %s: %d executions, effect delta %v", c.name, r.ID, r.Executions, r.EffectDelta)
			}
		}
	}
}

// gzipWriter compresses what a handler writes.
type gzipWriter struct {
	http.ResponseWriter
	z *gzip.Writer
}

func (w gzipWriter) Write(b []byte) (int, error) { return w.z.Write(b) }

// TestAcceptEncodingGiven: headers copied from a browser ("Copy as
// cURL") carry Accept-Encoding: gzip, deflate, br. An API that then
// compresses its answers is judged by what they say, not by their
// compressed bytes: the effect is read (it was "not JSON", and the run
// stopped) and the refusals are problem details.
func TestAcceptEncodingGiven(t *testing.T) {
	t.Parallel()
	mux, created := creatingMux(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			mux.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		z := gzip.NewWriter(w)
		defer z.Close()
		mux.ServeHTTP(gzipWriter{w, z}, r)
	}))
	t.Cleanup(srv.Close)
	rep := run(t, &probe.Config{URL: srv.URL + "/api", Body: []byte(fakeBody), Header: http.Header{"Accept-Encoding": {"gzip, deflate, br"}},
		EffectURL: srv.URL + "/count", EffectPath: "count"})
	if failed := statuses(rep, probe.Fail); len(failed) != 0 || rep.Effect.After != created.Load() {
		logReport(t, rep)
		t.Errorf("failed %q; effect %+v, the handler created %d", failed, rep.Effect, created.Load())
	}
}

// TestLateEffect: an API that, for the run's last request (the first
// caller's retry of the key the second caller then used), answers a
// replay and executes it again a moment later (a duplicate run on
// another node): the effect moves after the last check's read. The
// probe reads the effect once more after a quiet second: it used to
// read it right after the last check, and passed the API.
func TestLateEffect(t *testing.T) {
	t.Parallel()
	f, _ := startFake(t, knobs{})
	var mu sync.Mutex
	usedByOther := map[string]bool{} // keys the second caller sent
	var late sync.WaitGroup
	t.Cleanup(late.Wait)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		again := false
		switch {
		case r.Method != http.MethodPost || key == "":
		case r.Header.Get("X-User") == "other":
			usedByOther[key] = true
		case usedByOther[key]:
			again, usedByOther[key] = true, false
		}
		mu.Unlock()
		f.ServeHTTP(w, r)
		if again {
			late.Go(func() {
				time.Sleep(300 * time.Millisecond)
				f.execute(http.MethodPost, []byte(fakeBody), "probe")
			})
		}
	}))
	t.Cleanup(srv.Close)
	cfg := fakeConfig(srv.URL)
	cfg.EffectSettle = 0 // a second
	rep := run(t, cfg)
	late.Wait()
	if rep.CoreOK || rep.Effect.After != int64(f.executed()) {
		logReport(t, rep)
		t.Errorf("core OK %v, effect %+v; the fake executed %d: want a failure", rep.CoreOK, rep.Effect, f.executed())
	}
}

// TestGetServedByKey: an API whose idempotency layer covers GET and
// keeps a record per key alone (no path in it) serves a GET of another
// path the first GET's answer. get-untouched sends the key of its GET to
// the URL elsewhere too, and fails it; it passed (its keys never met
// another path but the POST's).
func TestGetServedByKey(t *testing.T) {
	t.Parallel()
	mux, created := creatingMux(t)
	mux.HandleFunc("GET /api", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, `{"items":%d}`, created.Load()) })
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"service":"shop"}`) })
	type stored struct {
		status int
		body   []byte
	}
	var mu sync.Mutex
	gets := map[string]stored{} // GET answers by key alone
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if r.Method != http.MethodGet || key == "" {
			mux.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if s, ok := gets[key]; ok {
			w.WriteHeader(s.status)
			w.Write(s.body)
			return
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		gets[key] = stored{rec.Code, rec.Body.Bytes()}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)
	rep := run(t, &probe.Config{URL: srv.URL + "/api", Body: []byte(fakeBody)})
	for _, r := range rep.Checks {
		if r.ID == "get-untouched" && r.Status != probe.Fail {
			t.Errorf("get-untouched %s: %s; want a failure", r.Status, r.Reason)
		}
	}
}

// creatingMux serves POST /api behind idemhttp's middleware (on memstore),
// creating an item per execution (201 {"id": n}), and GET /count
// ({"count": n}); the caller adds its own routes.
func creatingMux(t *testing.T) (*http.ServeMux, *atomic.Int64) {
	t.Helper()
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var created atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /api", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, created.Add(1))
	})))
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, `{"count":%d}`, created.Load()) })
	return mux, &created
}
