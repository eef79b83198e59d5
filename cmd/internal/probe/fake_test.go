package probe_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// knobs break one behaviour each of fakeAPI; the zero value is an API that
// behaves as the draft and Stripe say.
type knobs struct {
	noIdempotency  bool   // every request executes; keys are ignored
	noReplayHeader bool   // replays carry no Idempotent-Replayed
	ignoreBody     bool   // a key replays its first answer whatever the body (no 422)
	rawFingerprint bool   // bodies compared byte for byte (reordered JSON is a mismatch)
	poisonAfter422 bool   // after a mismatch, the key answers 422 for good
	missing500     bool   // a request without a key gets 500
	acceptOverlong bool   // keys up to 1024 bytes are taken
	interceptGET   bool   // GET requests are guarded too
	caseSensitive  bool   // the key header is read only as spelled Idempotency-Key
	quotedLiteral  bool   // a quoted key is taken with its quotes
	no4xxStore     bool   // a 4xx answer is not stored: the retry runs again
	races          bool   // lookup and insert are not atomic: concurrent duplicates both execute
	reexecutes     bool   // a retry executes again, and answers the first answer, marked replayed
	markerName     string // replays are marked under this name instead of Idempotent-Replayed
	quotedRefused  bool   // a quoted key is refused with 400
	quotedIgnored  bool   // a quoted key is ignored: the request runs unguarded
	lenientKeys    bool   // empty and non-UTF-8 keys are taken
	waitReplay     bool   // a duplicate in flight waits for the first and replays its answer
}

// fakeAPI is an idempotent API written for the probe's tests: POST /api
// creates an item (201 {"id": n}; a body holding "refuse" is 400), GET
// /api and GET /count answer {"count": n}, the number of items created.
type fakeAPI struct {
	k knobs

	mu       sync.Mutex
	records  map[string]*fakeRecord
	poisoned map[string]bool
	gates    map[string]chan struct{}
	count    int
}

type fakeRecord struct {
	ended  chan struct{} // closed when the first request ended
	fp     string
	done   bool
	status int
	body   []byte
}

// startFake serves a fakeAPI with k until the test ends.
func startFake(t *testing.T, k knobs) (*fakeAPI, string) {
	t.Helper()
	f := &fakeAPI{k: k, records: map[string]*fakeRecord{}, poisoned: map[string]bool{}, gates: map[string]chan struct{}{}}
	srv := httptest.NewUnstartedServer(f)
	if k.caseSensitive {
		srv.Listener = caseSensitiveListener{srv.Listener}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *fakeAPI) executed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch {
	case r.URL.Path == "/count" && r.Method == http.MethodGet,
		r.URL.Path == "/api" && r.Method == http.MethodGet && !f.k.interceptGET:
		f.answerCount(w)
		return
	case r.URL.Path != "/api":
		http.NotFound(w, r)
		return
	case r.Method != http.MethodPost && r.Method != http.MethodGet:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	if f.k.noIdempotency {
		status, out := f.execute(r.Method, body)
		writeJSON(w, status, out, "")
		return
	}
	values := r.Header.Values("Idempotency-Key")
	if len(values) == 0 {
		if f.k.missing500 {
			http.Error(w, "no key", http.StatusInternalServerError)
			return
		}
		writeJSON(w, http.StatusBadRequest, []byte(`{"code":"MISSING_KEY"}`), "")
		return
	}
	if v := values[0]; len(v) >= 2 && v[0] == '"' && (f.k.quotedRefused || f.k.quotedIgnored) {
		if f.k.quotedRefused {
			writeJSON(w, http.StatusBadRequest, []byte(`{"code":"INVALID_KEY"}`), "")
			return
		}
		status, out := f.execute(r.Method, body)
		writeJSON(w, status, out, "")
		return
	}
	key, ok := f.parseKey(values[0])
	if len(values) > 1 || !ok {
		writeJSON(w, http.StatusBadRequest, []byte(`{"code":"INVALID_KEY"}`), "")
		return
	}
	fp := r.Method + " " + f.fingerprint(body)

	f.mu.Lock()
	rec := f.records[key]
	if rec == nil && f.k.races {
		// Check, then act: wait for a concurrent duplicate (or 300 ms)
		// between the lookup and the insert.
		g, waiting := f.gates[key]
		if !waiting {
			g = make(chan struct{})
			f.gates[key] = g
		} else {
			select {
			case <-g:
			default:
				close(g)
			}
		}
		f.mu.Unlock()
		if !waiting {
			select {
			case <-g:
			case <-time.After(300 * time.Millisecond):
			}
		}
		f.mu.Lock()
	}
	switch {
	case rec == nil:
		rec = &fakeRecord{fp: fp, ended: make(chan struct{})}
		f.records[key] = rec
		f.mu.Unlock()
		status, out := f.execute(r.Method, body)
		f.mu.Lock()
		if status >= 400 && f.k.no4xxStore {
			delete(f.records, key)
		} else {
			rec.done, rec.status, rec.body = true, status, out
		}
		close(rec.ended)
		f.mu.Unlock()
		writeJSON(w, status, out, "")
	case f.poisoned[key]:
		f.mu.Unlock()
		writeJSON(w, http.StatusUnprocessableEntity, []byte(`{"code":"KEY_MISMATCH"}`), "")
	case rec.fp != fp && !f.k.ignoreBody:
		if f.k.poisonAfter422 {
			f.poisoned[key] = true
		}
		f.mu.Unlock()
		writeJSON(w, http.StatusUnprocessableEntity, []byte(`{"code":"KEY_MISMATCH"}`), "")
	case !rec.done && f.k.waitReplay:
		f.mu.Unlock()
		<-rec.ended
		f.mu.Lock()
		status, out := rec.status, rec.body
		f.mu.Unlock()
		writeJSON(w, status, out, f.marker())
	case !rec.done:
		f.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusConflict, []byte(`{"code":"PROCESSING"}`), "")
	default:
		status, out := rec.status, rec.body
		f.mu.Unlock()
		if f.k.reexecutes {
			f.execute(r.Method, body)
		}
		writeJSON(w, status, out, f.marker())
	}
}

// execute runs a request: a POST creates an item (or is refused), a GET
// (only when intercepted) reads the count.
func (f *fakeAPI) execute(method string, body []byte) (int, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if method == http.MethodGet {
		return http.StatusOK, []byte(fmt.Sprintf(`{"count":%d}`, f.count))
	}
	if bytes.Contains(body, []byte("refuse")) {
		return http.StatusBadRequest, []byte(`{"code":"REFUSED"}`)
	}
	f.count++
	return http.StatusCreated, []byte(fmt.Sprintf(`{"id":%d}`, f.count))
}

func (f *fakeAPI) answerCount(w http.ResponseWriter) {
	f.mu.Lock()
	n := f.count
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, []byte(fmt.Sprintf(`{"count":%d}`, n)), "")
}

func (f *fakeAPI) parseKey(v string) (string, bool) {
	if !f.k.quotedLiteral && len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	max := 255
	if f.k.acceptOverlong {
		max = 1024
	}
	if len(v) > max || strings.ContainsFunc(v, unicode.IsControl) ||
		(!f.k.lenientKeys && (v == "" || !utf8.ValidString(v))) {
		return "", false
	}
	return v, true
}

// fingerprint is the body's canonical JSON (members sorted), or its bytes.
func (f *fakeAPI) fingerprint(body []byte) string {
	var v any
	if f.k.rawFingerprint || json.Unmarshal(body, &v) != nil {
		return string(body)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// marker is the name of the header that marks a replay; "" for none.
func (f *fakeAPI) marker() string {
	switch {
	case f.k.noReplayHeader:
		return ""
	case f.k.markerName != "":
		return f.k.markerName
	}
	return "Idempotent-Replayed"
}

// writeJSON writes an answer, marked a replay under the header marker
// unless it is "".
func writeJSON(w http.ResponseWriter, status int, body []byte, marker string) {
	w.Header().Set("Content-Type", "application/json")
	if marker != "" {
		w.Header().Set(marker, "true")
	}
	w.WriteHeader(status)
	w.Write(body)
}

// caseSensitiveListener hides every spelling of the Idempotency-Key header
// name but that one from the server (net/http canonicalises names, so a
// Go handler cannot be case-sensitive on its own): the name is overwritten
// in the request's bytes with another of the same length.
type caseSensitiveListener struct{ net.Listener }

func (l caseSensitiveListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return caseSensitiveConn{c}, nil
}

type caseSensitiveConn struct{ net.Conn }

func (c caseSensitiveConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	const canon = "\r\nIdempotency-Key:"
	other := "\r\nX-" + strings.Repeat("x", len(canon)-6) + ":"
	b := p[:n]
	for i := 0; i+len(canon) <= len(b); i++ {
		if w := b[i : i+len(canon)]; bytes.EqualFold(w, []byte(canon)) && string(w) != canon {
			copy(w, other)
		}
	}
	return n, err
}
