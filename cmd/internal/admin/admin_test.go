package admin_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/admin"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

const token = "test-token-0123456789abcdef"

// fixture is an operator page over a SQLite store, inbox and step
// journal, with one completed record (scope "acct-7", key
// "secret-key-1") and one dead message ("loyalty", "msg-secret-1").
type fixture struct {
	h        http.Handler
	store    *sqlstore.Store
	inbox    *sqlstore.InboxStore
	ops      *sqlstore.StepJournal
	log      *obstest.LogBuffer
	counters *admin.Counters
}

func setup(t *testing.T, mod func(*admin.Config)) *fixture {
	t.Helper()
	ctx := t.Context()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "admin.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	if err := in.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	acq, err := st.Acquire(ctx, idem.AcquireRequest{Scope: "acct-7", Key: "secret-key-1", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || acq.Outcome != idem.Acquired {
		t.Fatal(acq, err)
	}
	if err := st.Complete(ctx, acq.Lease, idem.Response{StatusCode: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	c, err := in.Claim(ctx, "loyalty", "msg-secret-1", time.Minute, 1)
	if err != nil || !c.Claimed {
		t.Fatal(c, err)
	}
	if st, err := in.Fail(ctx, "loyalty", "msg-secret-1", c.Fence, 1, "points service down"); err != nil || st != inbox.StatusDead {
		t.Fatal(st, err)
	}
	ops, err := sqlstore.NewStepJournal(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ops.Close() })
	f := &fixture{store: st, inbox: in, ops: ops, log: &obstest.LogBuffer{}, counters: &admin.Counters{}}
	cfg := admin.Config{
		Token: token, Name: "testd",
		Logger:   slog.New(slog.NewTextHandler(f.log, nil)),
		Counters: f.counters, Store: st, Records: st, Messages: in, Operations: ops,
		Retry:     in.Revive,
		RetryHelp: "The record is made failed; the next delivery runs the handler.",
	}
	if mod != nil {
		mod(&cfg)
	}
	if f.h, err = admin.New(&cfg); err != nil {
		t.Fatal(err)
	}
	return f
}

type answer struct {
	code   int
	body   string
	header http.Header
}

// send serves one request: auth is "" (none), "bearer:TOKEN" or
// "cookie:VALUE"; form is posted when not nil.
func (f *fixture) send(t *testing.T, method, path, auth string, form url.Values) answer {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req := httptest.NewRequest(method, "http://shop.test"+path, body)
	req.RemoteAddr = "192.0.2.7:41000"
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	switch kind, v, _ := strings.Cut(auth, ":"); kind {
	case "bearer":
		req.Header.Set("Authorization", "Bearer "+v)
	case "cookie":
		req.AddCookie(&http.Cookie{Name: "idem_admin", Value: v})
	case "cookie+origin":
		req.AddCookie(&http.Cookie{Name: "idem_admin", Value: v})
		req.Header.Set("Origin", "http://evil.test")
	}
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	return answer{rec.Code, rec.Body.String(), rec.Header()}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([A-Za-z0-9_-]+)"`)

// login signs in with the form and returns the session's cookie and the
// CSRF token of its page.
func (f *fixture) login(t *testing.T) (cookie, csrf string) {
	t.Helper()
	a := f.send(t, "POST", "/admin/login", "", url.Values{"token": {token}})
	if a.code != http.StatusSeeOther {
		t.Fatalf("login: %d %s", a.code, a.body)
	}
	resp := http.Response{Header: a.header}
	for _, c := range resp.Cookies() {
		if c.Name == "idem_admin" {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/admin/" {
				t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/admin/", c)
			}
			cookie = c.Value
		}
	}
	if cookie == "" {
		t.Fatal("login set no cookie")
	}
	p := f.send(t, "GET", "/admin/", "cookie:"+cookie, nil)
	m := csrfField.FindStringSubmatch(p.body)
	if p.code != http.StatusOK || m == nil {
		t.Fatalf("page after login: %d, csrf %v", p.code, m)
	}
	return cookie, m[1]
}

func (f *fixture) recordExists(t *testing.T) bool {
	t.Helper()
	_, err := f.store.Get(t.Context(), "acct-7", "secret-key-1")
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func (f *fixture) message(t *testing.T) inbox.Record {
	t.Helper()
	r, err := f.inbox.Get(t.Context(), "loyalty", "msg-secret-1")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestOffWithoutToken(t *testing.T) {
	h, err := admin.New(&admin.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/admin/", "/admin/login", "/admin/evict", "/admin/static/admin.js"} {
		for _, auth := range []string{"", "Bearer "} {
			req := httptest.NewRequest("GET", path, nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusNotFound {
				t.Errorf("GET %s (%q) without a token: %d, want 404", path, auth, rec.Code)
			}
		}
	}
	if _, err := admin.New(&admin.Config{Token: "short"}); err == nil {
		t.Fatal("a 5-byte token was accepted")
	}
}

func TestAuth(t *testing.T) {
	f := setup(t, nil)
	for _, c := range []struct {
		what, method, path, auth string
		form                     url.Values
		want                     int
	}{
		{"no credentials", "GET", "/admin/", "", nil, http.StatusUnauthorized},
		{"wrong bearer", "GET", "/admin/", "bearer:" + token + "x", nil, http.StatusUnauthorized},
		{"a prefix of the token", "GET", "/admin/", "bearer:" + token[:20], nil, http.StatusUnauthorized},
		{"unknown session", "GET", "/admin/", "cookie:forged", nil, http.StatusUnauthorized},
		{"wrong bearer posts", "POST", "/admin/evict", "bearer:nope-nope-nope-nope", url.Values{"scope": {"acct-7"}, "key": {"secret-key-1"}, "confirm": {"yes"}}, http.StatusUnauthorized},
		{"no credentials post", "POST", "/admin/retry", "", url.Values{"group": {"loyalty"}, "id": {"msg-secret-1"}, "confirm": {"yes"}}, http.StatusUnauthorized},
		{"counters without credentials", "GET", "/admin/counters.json", "", nil, http.StatusUnauthorized},
		{"wrong login", "POST", "/admin/login", "", url.Values{"token": {"guess-guess-guess-guess"}}, http.StatusUnauthorized},
		{"right bearer", "GET", "/admin/", "bearer:" + token, nil, http.StatusOK},
		{"outside /admin/", "GET", "/orders", "bearer:" + token, nil, http.StatusNotFound},
	} {
		a := f.send(t, c.method, c.path, c.auth, c.form)
		if a.code != c.want {
			t.Errorf("%s: %s %s = %d, want %d", c.what, c.method, c.path, a.code, c.want)
		}
		if c.want == http.StatusUnauthorized && strings.Contains(a.body, "acct-7") {
			t.Errorf("%s: the answer shows a record", c.what)
		}
	}
	if a := f.send(t, "GET", "/admin/", "", nil); !strings.Contains(a.body, `action="/admin/login"`) {
		t.Errorf("GET /admin/ without credentials shows no login form:\n%s", a.body)
	}
	// Nothing was done by the refused posts.
	if !f.recordExists(t) || f.message(t).Status != inbox.StatusDead {
		t.Fatal("a refused post changed the store")
	}
	if !strings.Contains(f.log.String(), "failed login") {
		t.Errorf("the failed login is not logged:\n%s", f.log)
	}
	// A login shows the page; sign out ends the session.
	cookie, csrf := f.login(t)
	if a := f.send(t, "POST", "/admin/logout", "cookie:"+cookie, url.Values{"csrf": {csrf}}); a.code != http.StatusSeeOther {
		t.Fatalf("logout: %d", a.code)
	}
	if a := f.send(t, "GET", "/admin/", "cookie:"+cookie, nil); a.code != http.StatusUnauthorized {
		t.Fatalf("after logout: %d, want 401", a.code)
	}
}

func TestCSRF(t *testing.T) {
	f := setup(t, nil)
	cookie, csrf := f.login(t)
	evict := url.Values{"scope": {"acct-7"}, "key": {"secret-key-1"}, "confirm": {"yes"}}
	retry := url.Values{"group": {"loyalty"}, "id": {"msg-secret-1"}, "confirm": {"yes"}}
	for _, c := range []struct {
		what, path, auth, csrf string
		form                   url.Values
	}{
		{"evict without CSRF", "/admin/evict", "cookie:" + cookie, "", evict},
		{"evict with another CSRF", "/admin/evict", "cookie:" + cookie, csrf + "x", evict},
		{"retry without CSRF", "/admin/retry", "cookie:" + cookie, "", retry},
		{"evict from another origin", "/admin/evict", "cookie+origin:" + cookie, csrf, evict},
		{"logout without CSRF", "/admin/logout", "cookie:" + cookie, "", url.Values{}},
	} {
		form := url.Values{}
		for k, v := range c.form {
			form[k] = v
		}
		if c.csrf != "" {
			form.Set("csrf", c.csrf)
		}
		if a := f.send(t, "POST", c.path, c.auth, form); a.code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", c.what, a.code)
		}
	}
	if !f.recordExists(t) || f.message(t).Status != inbox.StatusDead {
		t.Fatal("a refused post changed the store")
	}
	// The session survived (logout was refused), and with its token the
	// same post acts.
	evict.Set("csrf", csrf)
	if a := f.send(t, "POST", "/admin/evict", "cookie:"+cookie, evict); a.code != http.StatusSeeOther {
		t.Fatalf("evict with the CSRF token: %d %s", a.code, a.body)
	}
	if f.recordExists(t) {
		t.Fatal("the record is still there")
	}
}

func TestEvict(t *testing.T) {
	f := setup(t, nil)
	cookie, csrf := f.login(t)
	hash := idem.HashKey("acct-7", "secret-key-1")
	page := f.send(t, "GET", "/admin/", "cookie:"+cookie, nil)
	if !strings.Contains(page.body, `data-hash="`+hash+`"`) || !strings.Contains(page.body, "secret-key-1") {
		t.Fatalf("the page does not list the record %s:\n%s", hash, page.body)
	}
	// The page's button: the key base64url-encoded. First the
	// confirmation page; the record stays.
	form := url.Values{"csrf": {csrf}, "scope64": {"YWNjdC03"}, "key64": {"c2VjcmV0LWtleS0x"}}
	a := f.send(t, "POST", "/admin/evict", "cookie:"+cookie, form)
	if a.code != http.StatusOK || !strings.Contains(a.body, "Evict record "+hash+"?") || !strings.Contains(a.body, `name="confirm" value="yes"`) {
		t.Fatalf("confirmation page: %d\n%s", a.code, a.body)
	}
	if !f.recordExists(t) {
		t.Fatal("the record went before the confirmation")
	}
	if strings.Contains(f.log.String(), "evict") {
		t.Fatalf("an unconfirmed eviction was logged as done:\n%s", f.log)
	}
	form.Set("confirm", "yes")
	a = f.send(t, "POST", "/admin/evict", "cookie:"+cookie, form)
	if a.code != http.StatusSeeOther || a.header.Get("Location") != "/admin/?done=evicted&ref="+hash {
		t.Fatalf("evict: %d, Location %q", a.code, a.header.Get("Location"))
	}
	if f.recordExists(t) {
		t.Fatal("the record is still in the store")
	}
	page = f.send(t, "GET", "/admin/?done=evicted&ref="+hash, "cookie:"+cookie, nil)
	if strings.Contains(page.body, `class="record" data-hash="`+hash+`"`) || !strings.Contains(page.body, "Record "+hash+" evicted.") {
		t.Fatalf("the page after the eviction:\n%s", page.body)
	}
	logs := f.log.String()
	if !strings.Contains(logs, "record evicted") || !strings.Contains(logs, "key_hash="+hash) || !strings.Contains(logs, "remote=192.0.2.7:41000") {
		t.Fatalf("the eviction's log line lacks what, which or who:\n%s", logs)
	}
	if strings.Contains(logs, "secret-key-1") || strings.Contains(logs, "acct-7") {
		t.Fatalf("the log shows the raw key or scope:\n%s", logs)
	}
}

// With LogKeys, the operator opted in: the log names the key.
func TestEvictLogKeys(t *testing.T) {
	f := setup(t, func(c *admin.Config) { c.LogKeys = true })
	a := f.send(t, "POST", "/admin/evict", "bearer:"+token, url.Values{"scope": {"acct-7"}, "key": {"secret-key-1"}, "confirm": {"yes"}})
	if a.code != http.StatusSeeOther || f.recordExists(t) {
		t.Fatalf("evict by bearer: %d, record still there: %v", a.code, f.recordExists(t))
	}
	if logs := f.log.String(); !strings.Contains(logs, "key=secret-key-1") || !strings.Contains(logs, "auth=bearer") {
		t.Fatalf("with LogKeys the log lacks the key:\n%s", logs)
	}
}

func TestRetry(t *testing.T) {
	f := setup(t, nil)
	cookie, csrf := f.login(t)
	hash := idem.HashKey("", "msg-secret-1")
	page := f.send(t, "GET", "/admin/", "cookie:"+cookie, nil)
	if !strings.Contains(page.body, `class="retry" data-hash="`+hash+`"`) || !strings.Contains(page.body, "points service down") {
		t.Fatalf("the page does not list the dead message with a retry button:\n%s", page.body)
	}
	form := url.Values{"csrf": {csrf}, "group64": {"bG95YWx0eQ"}, "id64": {"bXNnLXNlY3JldC0x"}}
	a := f.send(t, "POST", "/admin/retry", "cookie:"+cookie, form)
	if a.code != http.StatusOK || !strings.Contains(a.body, "Retry dead message "+hash+"?") || !strings.Contains(a.body, "the next delivery runs the handler") {
		t.Fatalf("confirmation page: %d\n%s", a.code, a.body)
	}
	if f.message(t).Status != inbox.StatusDead {
		t.Fatal("the message was retried before the confirmation")
	}
	form.Set("confirm", "yes")
	if a = f.send(t, "POST", "/admin/retry", "cookie:"+cookie, form); a.code != http.StatusSeeOther {
		t.Fatalf("retry: %d %s", a.code, a.body)
	}
	if r := f.message(t); r.Status != inbox.StatusFailed || r.Attempts != 0 {
		t.Fatalf("record after retry %+v, want failed with 0 attempts", r)
	}
	// The message is no longer dead: a second retry finds nothing to do.
	if a = f.send(t, "POST", "/admin/retry", "cookie:"+cookie, form); a.code != http.StatusConflict {
		t.Fatalf("second retry: %d, want 409", a.code)
	}
	page = f.send(t, "GET", "/admin/", "cookie:"+cookie, nil)
	if strings.Contains(page.body, `class="retry" data-hash="`+hash+`"`) {
		t.Fatal("the retried message is still listed as dead")
	}
	if !strings.Contains(page.body, `class="message" data-hash="`+hash+`"`) {
		t.Fatal("the retried message (failed, awaiting its delivery) is not listed as stuck")
	}
	logs := f.log.String()
	if !strings.Contains(logs, "dead message retried") || !strings.Contains(logs, "message_hash="+hash) || !strings.Contains(logs, "remote=192.0.2.7:41000") {
		t.Fatalf("the retry's log line lacks what, which or who:\n%s", logs)
	}
	if strings.Contains(logs, "msg-secret-1") {
		t.Fatalf("the log shows the raw message ID:\n%s", logs)
	}
}

func TestCounters(t *testing.T) {
	f := setup(t, nil)
	var c idem.Observer = f.counters
	ctx := context.Background()
	for range 3 {
		c.End(c.Start(ctx, idem.Event{Kind: idem.KindRequest, Route: "POST /orders"}), idem.Event{Kind: idem.KindRequest, Route: "POST /orders", Outcome: idem.OutcomeExecuted})
	}
	c.End(ctx, idem.Event{Kind: idem.KindRequest, Route: "POST /orders", Outcome: idem.OutcomeReplayed, KeyHash: "0123456789abcdef"})
	c.End(ctx, idem.Event{Kind: idem.KindOutbox, Op: idem.OpBacklog, N: 5}) // no outcome: not counted
	got := f.counters.Snapshot()
	if len(got) != 2 || got[0].Outcome != "executed" || got[0].N != 3 || got[1].Outcome != "replayed" || got[1].N != 1 || got[0].Kind != "request" {
		t.Fatalf("counters %+v", got)
	}
	a := f.send(t, "GET", "/admin/counters.json", "bearer:"+token, nil)
	if a.code != http.StatusOK || !strings.Contains(a.body, `"Outcome":"executed","N":3`) || strings.Contains(a.body, "0123456789abcdef") {
		t.Fatalf("counters.json: %d %s", a.code, a.body)
	}
	page := f.send(t, "GET", "/admin/", "bearer:"+token, nil)
	if !strings.Contains(page.body, "<td>POST /orders</td><td></td><td>executed</td><td class=\"n\">3</td>") {
		t.Fatalf("the page does not show the counter:\n%s", page.body)
	}
}

// A store that cannot list (Redis) says so, and still evicts by key.
func TestNoListing(t *testing.T) {
	f := setup(t, func(c *admin.Config) {
		c.Records, c.RecordsNote, c.Messages = nil, "the Redis store cannot list its records", nil
	})
	page := f.send(t, "GET", "/admin/", "bearer:"+token, nil)
	if !strings.Contains(page.body, "Listing records is not available: the Redis store cannot list its records.") || strings.Contains(page.body, "messages-section") {
		t.Fatalf("page:\n%s", page.body)
	}
	if a := f.send(t, "POST", "/admin/evict", "bearer:"+token, url.Values{"scope": {"acct-7"}, "key": {"secret-key-1"}, "confirm": {"yes"}}); a.code != http.StatusSeeOther || f.recordExists(t) {
		t.Fatalf("evict by key: %d", a.code)
	}
}

// TestMessageHashIsTheInboxs: a dead message is shown, and its retry
// logged, under the hash the inbox reports as the KeyHash of its
// handling (the idem.key_hash of its span), so that an operator finds
// its traces from the page.
func TestMessageHashIsTheInboxs(t *testing.T) {
	f := setup(t, nil)
	rec := &obstest.Recorder{}
	in, err := inbox.New(inbox.NewMemoryStore(), &inbox.Config{Group: "loyalty", Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Handle(t.Context(), inbox.Message{ID: "msg-secret-1"}, func(context.Context, inbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ends := rec.Ends(idem.KindInbox)
	if len(ends) != 1 || ends[0].KeyHash == "" {
		t.Fatalf("inbox ends %+v, want one with a KeyHash", ends)
	}
	hash := ends[0].KeyHash
	page := f.send(t, "GET", "/admin/", "bearer:"+token, nil)
	if !strings.Contains(page.body, `class="retry" data-hash="`+hash+`"`) {
		t.Fatalf("the dead message is not shown under the inbox's hash %s:\n%s", hash, page.body)
	}
	form := url.Values{"group64": {"bG95YWx0eQ"}, "id64": {"bXNnLXNlY3JldC0x"}, "confirm": {"yes"}}
	if a := f.send(t, "POST", "/admin/retry", "bearer:"+token, form); a.code != http.StatusSeeOther {
		t.Fatalf("retry: %d %s", a.code, a.body)
	}
	if logs := f.log.String(); !strings.Contains(logs, "message_hash="+hash) {
		t.Fatalf("the retry is not logged under the inbox's hash %s:\n%s", hash, logs)
	}
}

// TestEvictRefusesALiveExecution: a record whose lease is live is being
// executed; evicting it would let a retry run the request a second time
// while the first still runs. The page refuses (409, before and at the
// confirmation) and keeps it; once its lease ended (the holder died), it
// is evicted.
func TestEvictRefusesALiveExecution(t *testing.T) {
	var now atomic.Pointer[time.Time]
	t0 := time.Now()
	now.Store(&t0)
	f := setup(t, func(c *admin.Config) { c.Now = func() time.Time { return *now.Load() } })
	ctx := t.Context()
	acq, err := f.store.Acquire(ctx, idem.AcquireRequest{Scope: "acct-8", Key: "running-key", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || acq.Outcome != idem.Acquired {
		t.Fatal(acq, err)
	}
	exists := func() bool {
		_, err := f.store.Get(ctx, "acct-8", "running-key")
		if err != nil && !errors.Is(err, idem.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	form := url.Values{"scope": {"acct-8"}, "key": {"running-key"}}
	if a := f.send(t, "POST", "/admin/evict", "bearer:"+token, form); a.code != http.StatusConflict {
		t.Fatalf("confirmation of a live record's eviction: %d, want 409\n%s", a.code, a.body)
	}
	form.Set("confirm", "yes")
	if a := f.send(t, "POST", "/admin/evict", "bearer:"+token, form); a.code != http.StatusConflict || !exists() {
		t.Fatalf("eviction of a live record: %d, record kept %v; want 409 and kept", a.code, exists())
	}
	if logs := f.log.String(); !strings.Contains(logs, "refused to evict") || strings.Contains(logs, "running-key") {
		t.Fatalf("the refusal's log line:\n%s", logs)
	}
	later := t0.Add(2 * time.Minute) // the lease ended: its holder died
	now.Store(&later)
	if a := f.send(t, "POST", "/admin/evict", "bearer:"+token, form); a.code != http.StatusSeeOther || exists() {
		t.Fatalf("eviction after the lease ended: %d, record kept %v; want 303 and gone", a.code, exists())
	}
}

// TestStoredTextIsEscaped: keys, scopes, message IDs and error texts come
// from clients and handlers: the page, its confirmation pages and its
// error answers show them as text, never as markup.
func TestStoredTextIsEscaped(t *testing.T) {
	const scope, key = `"><img src=x onerror=alert(1)>`, `<script>alert("k")</script>`
	const id, lastErr = `<script>alert("id")</script>`, `<b onmouseover=alert(2)>down</b>`
	f := setup(t, func(c *admin.Config) {
		c.Held = func(context.Context, int) ([]admin.Held, error) {
			return []admin.Held{{Ref: `<svg onload=alert(3)>`, Order: "o-1", Reason: `<iframe src=javascript:alert(4)>`}}, nil
		}
		c.Retry = func(context.Context, string, string) error { return errors.New(`<script>alert("retry")</script>`) }
	})
	ctx := t.Context()
	acq, err := f.store.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || acq.Outcome != idem.Acquired {
		t.Fatal(acq, err)
	}
	if err := f.store.Complete(ctx, acq.Lease, idem.Response{StatusCode: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	c, err := f.inbox.Claim(ctx, "loyalty", id, time.Minute, 1)
	if err != nil || !c.Claimed {
		t.Fatal(c, err)
	}
	if _, err := f.inbox.Fail(ctx, "loyalty", id, c.Fence, 1, lastErr); err != nil {
		t.Fatal(err)
	}
	markup := []string{"<script>alert", "<img src=x", "<b onmouseover", "<svg onload", "<iframe src"}
	check := func(what string, a answer) {
		t.Helper()
		for _, m := range markup {
			if strings.Contains(a.body, m) {
				t.Errorf("%s (%d) holds the markup %q:\n%s", what, a.code, m, a.body)
			}
		}
	}
	page := f.send(t, "GET", "/admin/", "bearer:"+token, nil)
	if page.code != http.StatusOK || !strings.Contains(page.body, idem.HashKey(scope, key)) || !strings.Contains(page.body, idem.HashKey("", id)) {
		t.Fatalf("the page does not list the record and the message: %d", page.code)
	}
	check("the page", page)
	check("the eviction's confirmation", f.send(t, "POST", "/admin/evict", "bearer:"+token, url.Values{"scope": {scope}, "key": {key}}))
	check("the retry's confirmation", f.send(t, "POST", "/admin/retry", "bearer:"+token, url.Values{"group": {"loyalty"}, "id": {id}}))
	failed := f.send(t, "POST", "/admin/retry", "bearer:"+token, url.Values{"group": {"loyalty"}, "id": {id}, "confirm": {"yes"}})
	if ct := failed.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") || failed.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("a failed retry's answer is %q (nosniff %q), want text/plain and nosniff", ct, failed.header.Get("X-Content-Type-Options"))
	}
}

// TestEvictMissingRecord: evicting a key that has no record (typed with
// another scope, or evicted already) is answered 404, not as a failure of
// the store (502), and logged as such by the key's hash.
func TestEvictMissingRecord(t *testing.T) {
	f := setup(t, nil)
	form := url.Values{"scope": {"acct-7"}, "key": {"no-such-key"}, "confirm": {"yes"}}
	a := f.send(t, "POST", "/admin/evict", "bearer:"+token, form)
	if a.code != http.StatusNotFound || !strings.Contains(a.body, idem.HashKey("acct-7", "no-such-key")) {
		t.Fatalf("evict of a missing record: %d %q, want 404 naming its hash", a.code, a.body)
	}
	if !f.recordExists(t) {
		t.Fatal("another record was evicted")
	}
	if logs := f.log.String(); !strings.Contains(logs, "evict found no record") || strings.Contains(logs, "evict failed") || strings.Contains(logs, "no-such-key") {
		t.Fatalf("the log:\n%s", logs)
	}
}

// The session cookie is Secure whenever the browser reached the page over
// HTTPS: on a TLS connection, or behind a TLS-terminating proxy that says
// so (X-Forwarded-Proto, Forwarded); on plain HTTP it cannot be, or the
// browser would never send it back.
func TestSessionCookieSecureBehindTLS(t *testing.T) {
	f := setup(t, nil)
	for _, c := range []struct {
		name   string
		set    func(*http.Request)
		secure bool
	}{
		{"plain HTTP", func(*http.Request) {}, false},
		{"TLS connection", func(r *http.Request) { r.TLS = &tls.ConnectionState{} }, true},
		{"X-Forwarded-Proto", func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "HTTPS") }, true},
		{"X-Forwarded-Proto http", func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "http") }, false},
		{"Forwarded", func(r *http.Request) { r.Header.Set("Forwarded", `for=192.0.2.1;proto="https";by=203.0.113.9`) }, true},
		{"Forwarded http", func(r *http.Request) { r.Header.Set("Forwarded", "for=192.0.2.1;proto=http") }, false},
	} {
		req := httptest.NewRequest("POST", "http://shop.test/admin/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		c.set(req)
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, req)
		resp := http.Response{Header: rec.Header()}
		var got *http.Cookie
		for _, ck := range resp.Cookies() {
			if ck.Name == "idem_admin" {
				got = ck
			}
		}
		if rec.Code != http.StatusSeeOther || got == nil {
			t.Fatalf("%s: login %d, cookie %v", c.name, rec.Code, got)
		}
		if got.Secure != c.secure {
			t.Errorf("%s: cookie Secure = %v, want %v", c.name, got.Secure, c.secure)
		}
	}
}
