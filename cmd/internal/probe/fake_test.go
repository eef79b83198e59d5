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
	noIdempotency  bool          // every request executes; keys are ignored
	noReplayHeader bool          // replays carry no Idempotent-Replayed
	ignoreBody     bool          // a key replays its first answer whatever the body (no 422)
	rawFingerprint bool          // bodies compared byte for byte (reordered JSON is a mismatch)
	poisonAfter422 bool          // after a mismatch, the key answers 422 for good
	missing500     bool          // a request without a key gets 500
	acceptOverlong bool          // keys up to 1024 bytes are taken
	interceptGET   bool          // GET requests are guarded too
	caseSensitive  bool          // the key header is read only as spelled Idempotency-Key
	quotedLiteral  bool          // a quoted key is taken with its quotes
	no4xxStore     bool          // a 4xx answer is not stored: the retry runs again
	races          bool          // lookup and insert are not atomic: concurrent duplicates both execute
	reexecutes     bool          // a retry executes again, and answers the first answer, marked replayed
	markerName     string        // replays are marked under this name instead of Idempotent-Replayed
	quotedRefused  bool          // a quoted key is refused with 400
	quotedIgnored  bool          // a quoted key is ignored: the request runs unguarded
	lenientKeys    bool          // empty and non-UTF-8 keys are taken
	waitReplay     bool          // a duplicate in flight waits for the first and replays its answer
	waitNoCompare  bool          // a duplicate in flight waits and replays, whatever its body
	storeCookie    bool          // an execution's Set-Cookie is stored and replayed
	getFromRecord  bool          // a GET carrying a known key, on any path, gets the key's answer, unmarked
	globalKeys     bool          // keys are not scoped to the caller (X-User)
	keep5xx        bool          // a 5xx answer is stored and replayed
	no409After     bool          // a 409 carries no Retry-After
	plainErrors    bool          // refusals are application/json, not problem details
	countPerUser   bool          // GET /count counts the caller's items only
	retention      time.Duration // records end this long after their completion; 0: never
	expireEarly    bool          // records end at half the retention
	neverExpire    bool          // records outlive the retention
	keyOptional    bool          // a request without a key runs unguarded
	fpCaller       bool          // the fingerprint holds the caller: another caller's use of a key is a mismatch
	execDelay      time.Duration // an execution takes this long (duplicates then come in flight)
	strictMembers  int           // a JSON body with a member other than item and qty is refused with this status, before the key is read
	foldCookie     bool          // an execution's Set-Cookie is stored and replayed folded with lang=en into one line
	expireBy       time.Duration // records end this long before the retention
	fpKnown        bool          // the fingerprint is over item and qty alone (the parsed request: other members are dropped)
	foreignKey     int           // a key another caller's record holds is refused with this status
}

// fakeAPI is an idempotent API written for the probe's tests: POST /api
// creates an item (201 {"id": n}; a body holding "refuse" is 400, one
// holding "fail" is 500), GET /api and GET /count answer {"count": n},
// the number of items created (by the caller, with countPerUser). The
// caller is the X-User header; keys are scoped to it. An execution sets
// the cookie sid (its own) and every answer the cookie lang=en.
type fakeAPI struct {
	k knobs

	mu       sync.Mutex
	records  map[string]*fakeRecord
	poisoned map[string]bool
	gates    map[string]chan struct{}
	count    int
	perUser  map[string]int
	failures int
	// What the fake did, the ground truth of the checks that scheduling
	// decides: 409s answered (and per key), the fingerprints each key
	// was sent with, and replays given to another body.
	conflicts    int
	conflictsOn  map[string]int
	fingerprints map[string]map[string]bool
	crossReplays int
}

type fakeRecord struct {
	ended  chan struct{} // closed when the first request ended
	fp     string
	done   bool
	status int
	body   []byte
	cookie string    // the execution's Set-Cookie
	user   string    // the caller whose request made it
	until  time.Time // when the record ends; zero: never
}

// startFake serves a fakeAPI with k until the test ends.
func startFake(t *testing.T, k knobs) (*fakeAPI, string) {
	t.Helper()
	f := &fakeAPI{k: k, records: map[string]*fakeRecord{}, poisoned: map[string]bool{}, gates: map[string]chan struct{}{}, perUser: map[string]int{},
		conflictsOn: map[string]int{}, fingerprints: map[string]map[string]bool{}}
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

// did returns the fake's 409s and its replays to another body.
func (f *fakeAPI) did() (conflicts, crossReplays int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conflicts, f.crossReplays
}

// conflictsOneBody returns the fake's 409s to keys sent with one body
// only (the concurrent check's, not concurrent-mismatch's).
func (f *fakeAPI) conflictsOneBody() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for key, c := range f.conflictsOn {
		if len(f.fingerprints[key]) == 1 {
			n += c
		}
	}
	return n
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	user := r.Header.Get("X-User")
	w.Header().Add("Set-Cookie", "lang=en; Path=/")
	if r.Method == http.MethodGet && f.k.getFromRecord {
		if v := r.Header.Get("Idempotency-Key"); v != "" {
			f.mu.Lock()
			rec := f.records[f.recordKey(user, v)]
			f.mu.Unlock()
			if rec != nil && rec.done {
				writeJSON(w, rec.status, rec.body, "")
				return
			}
		}
	}
	switch {
	case r.URL.Path == "/count" && r.Method == http.MethodGet,
		r.URL.Path == "/api" && r.Method == http.MethodGet && !f.k.interceptGET:
		f.answerCount(w, user)
		return
	case r.URL.Path != "/api":
		http.NotFound(w, r)
		return
	case r.Method != http.MethodPost && r.Method != http.MethodGet:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	if f.k.strictMembers != 0 && r.Method == http.MethodPost && unknownMembers(body) {
		// A validation ahead of the idempotency layer: the body is
		// refused whatever its key.
		writeJSON(w, f.k.strictMembers, []byte(`{"code":"VALIDATION","detail":"unknown member"}`), "")
		return
	}
	if f.k.noIdempotency {
		status, out, cookie := f.execute(r.Method, body, user)
		addCookie(w, cookie)
		writeJSON(w, status, out, "")
		return
	}
	values := r.Header.Values("Idempotency-Key")
	if len(values) == 0 {
		if f.k.missing500 {
			http.Error(w, "no key", http.StatusInternalServerError)
			return
		}
		if f.k.keyOptional {
			status, out, cookie := f.execute(r.Method, body, user)
			addCookie(w, cookie)
			writeJSON(w, status, out, "")
			return
		}
		f.refuse(w, http.StatusBadRequest, "MISSING_KEY")
		return
	}
	if v := values[0]; len(v) >= 2 && v[0] == '"' && (f.k.quotedRefused || f.k.quotedIgnored) {
		if f.k.quotedRefused {
			f.refuse(w, http.StatusBadRequest, "INVALID_KEY")
			return
		}
		status, out, cookie := f.execute(r.Method, body, user)
		addCookie(w, cookie)
		writeJSON(w, status, out, "")
		return
	}
	key, ok := f.parseKey(values[0])
	if len(values) > 1 || !ok {
		f.refuse(w, http.StatusBadRequest, "INVALID_KEY")
		return
	}
	key = f.recordKey(user, key)
	fp := r.Method + " " + f.fingerprint(body)
	if f.k.fpCaller {
		fp += " " + user
	}

	f.mu.Lock()
	if f.fingerprints[key] == nil {
		f.fingerprints[key] = map[string]bool{}
	}
	f.fingerprints[key][fp] = true
	rec := f.records[key]
	if rec != nil && rec.done && !rec.until.IsZero() && time.Now().After(rec.until) {
		delete(f.records, key)
		rec = nil
	}
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
	case rec != nil && f.k.foreignKey != 0 && rec.user != user:
		f.mu.Unlock()
		f.refuse(w, f.k.foreignKey, "FOREIGN_KEY")
	case rec == nil:
		rec = &fakeRecord{fp: fp, ended: make(chan struct{}), user: user}
		f.records[key] = rec
		f.mu.Unlock()
		status, out, cookie := f.execute(r.Method, body, user)
		f.mu.Lock()
		if status >= 400 && f.k.no4xxStore || status >= 500 && !f.k.keep5xx {
			delete(f.records, key)
		} else {
			rec.done, rec.status, rec.body, rec.cookie = true, status, out, cookie
			if f.k.retention > 0 && !f.k.neverExpire {
				ret := f.k.retention
				if f.k.expireEarly {
					ret /= 2
				}
				ret -= f.k.expireBy
				rec.until = time.Now().Add(ret)
			}
		}
		close(rec.ended)
		f.mu.Unlock()
		addCookie(w, cookie)
		writeJSON(w, status, out, "")
	case f.poisoned[key]:
		f.mu.Unlock()
		f.refuse(w, http.StatusUnprocessableEntity, "KEY_MISMATCH")
	case !rec.done && f.k.waitNoCompare:
		if rec.fp != fp {
			f.crossReplays++
		}
		f.mu.Unlock()
		<-rec.ended
		f.replay(w, rec, r.Method, body, user)
	case rec.fp != fp && f.k.ignoreBody && rec.done:
		f.crossReplays++
		f.mu.Unlock()
		f.replay(w, rec, r.Method, body, user)
	case rec.fp != fp && !f.k.ignoreBody:
		if f.k.poisonAfter422 {
			f.poisoned[key] = true
		}
		f.mu.Unlock()
		f.refuse(w, http.StatusUnprocessableEntity, "KEY_MISMATCH")
	case !rec.done && f.k.waitReplay:
		f.mu.Unlock()
		<-rec.ended
		f.replay(w, rec, r.Method, body, user)
	case !rec.done:
		f.conflicts++
		f.conflictsOn[key]++
		f.mu.Unlock()
		if !f.k.no409After {
			w.Header().Set("Retry-After", "1")
		}
		f.refuse(w, http.StatusConflict, "PROCESSING")
	default:
		f.mu.Unlock()
		f.replay(w, rec, r.Method, body, user)
	}
}

// addCookie sets an execution's cookie, if it has one.
func addCookie(w http.ResponseWriter, cookie string) {
	if cookie != "" {
		w.Header().Add("Set-Cookie", cookie)
	}
}

// recordKey is the record's key of a caller's key.
func (f *fakeAPI) recordKey(user, key string) string {
	if f.k.globalKeys {
		return key
	}
	return user + "\x00" + key
}

// replay answers rec's response (rec has ended; a released record's
// waiter runs the request itself).
func (f *fakeAPI) replay(w http.ResponseWriter, rec *fakeRecord, method string, body []byte, user string) {
	f.mu.Lock()
	done, status, out, cookie := rec.done, rec.status, rec.body, rec.cookie
	f.mu.Unlock()
	if !done {
		status, out, cookie = f.execute(method, body, user)
		addCookie(w, cookie)
		writeJSON(w, status, out, "")
		return
	}
	if f.k.reexecutes {
		f.execute(method, body, user)
	}
	if f.k.storeCookie {
		addCookie(w, cookie)
	}
	if f.k.foldCookie && cookie != "" {
		// Headers kept as one string each, their values joined.
		w.Header().Set("Set-Cookie", "lang=en; Path=/, "+cookie)
	}
	writeJSON(w, status, out, f.marker())
}

// refuse answers a refusal of the key: a problem detail, or plain JSON.
func (f *fakeAPI) refuse(w http.ResponseWriter, status int, code string) {
	if f.k.plainErrors {
		writeJSON(w, status, []byte(`{"code":"`+code+`"}`), "")
		return
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"https://example.com/problems/%s","title":%q,"status":%d,"code":%q}`, code, http.StatusText(status), status, code)
}

// execute runs a request: a POST creates an item (or is refused, or
// fails), a GET (only when intercepted) reads the count. It returns the
// answer and the execution's cookie.
func (f *fakeAPI) execute(method string, body []byte, user string) (int, []byte, string) {
	if f.k.execDelay > 0 {
		time.Sleep(f.k.execDelay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if method == http.MethodGet {
		return http.StatusOK, []byte(fmt.Sprintf(`{"count":%d}`, f.count)), ""
	}
	if bytes.Contains(body, []byte("refuse")) {
		return http.StatusBadRequest, []byte(`{"code":"REFUSED"}`), ""
	}
	if bytes.Contains(body, []byte("fail")) {
		f.failures++
		return http.StatusInternalServerError, []byte(fmt.Sprintf(`{"code":"UPSTREAM","attempt":%d}`, f.failures)), ""
	}
	f.count++
	f.perUser[user]++
	return http.StatusCreated, []byte(fmt.Sprintf(`{"id":%d}`, f.count)), fmt.Sprintf("sid=s%d; Path=/; HttpOnly", f.count)
}

func (f *fakeAPI) answerCount(w http.ResponseWriter, user string) {
	f.mu.Lock()
	n := f.count
	if f.k.countPerUser {
		n = f.perUser[user]
	}
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

// unknownMembers reports whether body is a JSON object with a member
// other than item and qty.
func unknownMembers(body []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return false
	}
	for name := range m {
		if name != "item" && name != "qty" {
			return true
		}
	}
	return false
}

// fingerprint is the body's canonical JSON (members sorted), or its bytes.
func (f *fakeAPI) fingerprint(body []byte) string {
	if f.k.fpKnown {
		var order struct {
			Item string          `json:"item"`
			Qty  json.RawMessage `json:"qty"`
		}
		if json.Unmarshal(body, &order) == nil {
			b, _ := json.Marshal(order)
			return string(b)
		}
	}
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
