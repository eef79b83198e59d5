package admin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/tieredstore"
)

// MinTokenLen is the shortest token New accepts.
const MinTokenLen = 16

// DefaultLimit is Config.Limit's default.
const DefaultLimit = 50

// sessionTTL is how long a login lasts; maxSessions bounds the logins
// kept (the oldest goes first).
const (
	sessionTTL  = 12 * time.Hour
	maxSessions = 64
	cookieName  = "idem_admin"
)

// Records lists idempotency records: sqlstore's Store.List.
type Records interface {
	List(ctx context.Context, status idem.Status, limit int) ([]idem.Record, error)
}

// Messages lists consume records: sqlstore's InboxStore.List.
type Messages interface {
	List(ctx context.Context, status inbox.Status, limit int) ([]inbox.Record, error)
}

// Operations lists and retries the operations of package steps: a
// steps.Journal (sqlstore.StepJournal, or a Runner's Journal()) is one.
type Operations interface {
	List(ctx context.Context, state steps.State, limit int) ([]steps.Entry, error)
	Get(ctx context.Context, scope, key string) (steps.Entry, error)
	Retry(ctx context.Context, scope, key string) error
}

// Held is a payment held for reconciliation, or another item the
// application wants an operator to look at.
type Held struct {
	// Ref identifies it (a trade number).
	Ref string
	// Order is the order it is about.
	Order       string
	AmountCents int64
	// Reason says why it is held.
	Reason string
	At     time.Time
}

// Config configures the operator page.
type Config struct {
	// Token is the operator's secret, at least MinTokenLen bytes. Empty:
	// the page is off, and every request under it is answered 404.
	Token string
	// Name is the program's name, shown in the page's title ("shopd").
	Name string
	// Logger logs every action and every failed login; nil discards.
	Logger *slog.Logger
	// LogKeys logs the raw scope and key of an evicted record and the
	// message ID of a retried message; by default only their
	// idem.HashKey, which identifies them in traces and logs without
	// revealing them.
	LogKeys bool
	// Counters are the live counters shown; nil: none.
	Counters *Counters
	// Store evicts records (Delete); nil: no eviction.
	Store idem.Store
	// Records lists the in-flight and the oldest records; nil: the page
	// says RecordsNote (or that the store cannot list them).
	Records     Records
	RecordsNote string
	// Messages lists stuck and dead consume records; nil: no such
	// section.
	Messages Messages
	// Retry retries the dead message id of group: it must make the
	// record handled again on its next delivery and publish the message
	// again. RetryHelp says what it does, on the confirmation page. Nil:
	// no retry button.
	Retry     func(ctx context.Context, group, id string) error
	RetryHelp string
	// Operations lists the dead and the waiting operations of package
	// steps, each with a button that retries it (Operations.Retry: due
	// now, a dead one with its attempts counted from 0 again); nil: no
	// such section.
	Operations Operations
	// Held lists the payments held for reconciliation; nil: no such
	// section. HeldNote describes them.
	Held     func(ctx context.Context, limit int) ([]Held, error)
	HeldNote string
	// Limit bounds each list; 0 means DefaultLimit.
	Limit int
	// Now is the clock the page compares leases with; nil: time.Now.
	Now func() time.Time
}

// Handler serves the operator page under /admin/.
type Handler struct {
	cfg      Config
	log      *slog.Logger
	tokenSum [sha256.Size]byte
	static   http.Handler

	mu       sync.Mutex
	sessions map[string]*session

	limit limiter
}

type session struct {
	csrf    string
	expires time.Time
	created time.Time
}

// New returns the operator page's handler, to be mounted at /admin/ (it
// serves the paths under /admin/ and answers 404 to the others). A Config
// without a Token gives a handler that answers 404 to everything.
func New(cfg *Config) (http.Handler, error) {
	if cfg == nil || cfg.Token == "" {
		return http.NotFoundHandler(), nil
	}
	c := *cfg
	if len(c.Token) < MinTokenLen {
		return nil, fmt.Errorf("admin: the token must be at least %d bytes (use e.g. 32 random hex digits)", MinTokenLen)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Limit <= 0 {
		c.Limit = DefaultLimit
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Name == "" {
		c.Name = "idem"
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: c, log: c.Logger, tokenSum: sha256.Sum256([]byte(c.Token)), sessions: map[string]*session{},
		static: http.StripPrefix("/admin/static/", http.FileServerFS(sub))}
	return h, nil
}

// who is how a request was authenticated.
type who struct {
	// via is "bearer" or "session".
	via string
	// sess is the login's session (nil for a bearer token).
	sess *session
	// id identifies the session in logs (a hash of its cookie).
	id string
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin") // no-referrer would make a browser send "Origin: null" on the page's own posts
	w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	}
	path := r.URL.Path
	switch {
	case strings.HasPrefix(path, "/admin/static/") && r.Method == http.MethodGet:
		h.static.ServeHTTP(w, r)
		return
	case path == "/admin/login" && r.Method == http.MethodPost:
		h.login(w, r)
		return
	case path == "/admin" || !strings.HasPrefix(path, "/admin/"):
		http.NotFound(w, r)
		return
	}
	u, status, wait := h.authenticate(r)
	if status == http.StatusTooManyRequests {
		h.tooMany(w, wait, false)
		return
	}
	if status != 0 {
		if status == http.StatusUnauthorized && r.Method == http.MethodGet && path == "/admin/" && !hasBearer(r) {
			h.render(w, http.StatusUnauthorized, "login", loginPage{Name: h.cfg.Name})
			return
		}
		http.Error(w, http.StatusText(status), status)
		return
	}
	switch {
	case path == "/admin/" && r.Method == http.MethodGet:
		h.page(w, r, u)
	case path == "/admin/counters.json" && r.Method == http.MethodGet:
		h.countersJSON(w)
	case path == "/admin/logout" && r.Method == http.MethodPost:
		if !h.checkCSRF(w, r, u) {
			return
		}
		h.logout(w, r, u)
	case path == "/admin/evict" && r.Method == http.MethodPost:
		if !h.checkCSRF(w, r, u) {
			return
		}
		h.evict(w, r, u)
	case path == "/admin/retry" && r.Method == http.MethodPost:
		if !h.checkCSRF(w, r, u) {
			return
		}
		h.retry(w, r, u)
	case path == "/admin/retry-op" && r.Method == http.MethodPost:
		if !h.checkCSRF(w, r, u) {
			return
		}
		h.retryOp(w, r, u)
	case path == "/admin/" || path == "/admin/counters.json" || path == "/admin/logout" || path == "/admin/evict" || path == "/admin/retry" || path == "/admin/retry-op":
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
	default:
		http.NotFound(w, r)
	}
}

// tokenOK compares given with the token in constant time (over their
// hashes, so that the length does not show either).
func (h *Handler) tokenOK(given string) bool {
	sum := sha256.Sum256([]byte(given))
	return subtle.ConstantTimeCompare(sum[:], h.tokenSum[:]) == 1
}

// authenticate finds the request's operator: a bearer token, or a
// session cookie. 401 when neither is valid; 429, and how long to wait,
// when the request's client or everyone is locked out of token checks
// (see limited). An Authorization header of another scheme (a proxy's
// HTTP Basic authentication in front of the page, which the browser
// sends with every request) is not a token check: the cookie decides.
func (h *Handler) authenticate(r *http.Request) (who, int, time.Duration) {
	if tok, isBearer := bearer(r); isBearer {
		ok := h.tokenOK(tok)
		if wait, refused := h.limited(r, ok, "bearer"); refused {
			return who{}, http.StatusTooManyRequests, wait
		}
		if ok {
			return who{via: "bearer"}, 0, 0
		}
		return who{}, http.StatusUnauthorized, 0
	}
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return who{}, http.StatusUnauthorized, 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sessions[c.Value]
	if s == nil {
		return who{}, http.StatusUnauthorized, 0
	}
	if h.cfg.Now().After(s.expires) {
		delete(h.sessions, c.Value)
		return who{}, http.StatusUnauthorized, 0
	}
	return who{via: "session", sess: s, id: sessionID(c.Value)}, 0, 0
}

// bearer returns the token of the request's "Authorization: Bearer"
// header, and whether it has one.
func bearer(r *http.Request) (string, bool) {
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return strings.TrimSpace(tok), strings.EqualFold(scheme, "Bearer")
}

func hasBearer(r *http.Request) bool {
	_, ok := bearer(r)
	return ok
}

// limited passes the result ok of a token check (of the login form, or
// a bearer token) through the login limits: it reports whether the
// attempt is refused, whatever ok is, and how long its client is to
// wait. A refusal is logged once per lockout; a failure is logged and
// counted.
func (h *Handler) limited(r *http.Request, ok bool, via string) (time.Duration, bool) {
	key := clientKey(r)
	ref, passed := h.limit.check(key, h.cfg.Now(), ok)
	if ref.wait > 0 {
		if ref.log {
			who := "client " + key
			if ref.global {
				who = fmt.Sprintf("all clients (more than %d failures in %s)", globalFailures, globalWindow)
			}
			h.log.WarnContext(r.Context(), "admin: too many failed logins: refusing "+who+" until the lockout ends (logged once per lockout)",
				"remote", r.RemoteAddr, "auth", via, "retry_after_s", retryAfter(ref.wait))
		}
		return ref.wait, true
	}
	if !passed {
		h.log.WarnContext(r.Context(), "admin: failed login", "remote", r.RemoteAddr, "auth", via)
	}
	return 0, false
}

// tooMany answers an attempt refused by the login limits: 429 with
// Retry-After (the login form again, when form).
func (h *Handler) tooMany(w http.ResponseWriter, wait time.Duration, form bool) {
	s := retryAfter(wait)
	w.Header().Set("Retry-After", strconv.Itoa(s))
	if form {
		h.render(w, http.StatusTooManyRequests, "login", loginPage{Name: h.cfg.Name, Wait: s})
		return
	}
	http.Error(w, fmt.Sprintf("too many failed logins: try again in %d s", s), http.StatusTooManyRequests)
}

// sessionID names a session in logs without giving its cookie away.
func sessionID(cookie string) string {
	sum := sha256.Sum256([]byte(cookie))
	return hex.EncodeToString(sum[:6])
}

// checkCSRF refuses (403) a form post of a session without the session's
// CSRF token, or from another origin. A bearer token is not sent by a
// browser on its own, so its requests need none.
func (h *Handler) checkCSRF(w http.ResponseWriter, r *http.Request, u who) bool {
	if !sameOrigin(r) {
		h.log.WarnContext(r.Context(), "admin: refused a post from another origin", "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"), "path", r.URL.Path)
		http.Error(w, "cross-origin post refused", http.StatusForbidden)
		return false
	}
	if u.sess == nil {
		return true
	}
	given := r.PostFormValue("csrf")
	if given == "" || subtle.ConstantTimeCompare([]byte(given), []byte(u.sess.csrf)) != 1 {
		h.log.WarnContext(r.Context(), "admin: refused a post without the session's CSRF token", "remote", r.RemoteAddr, "session", u.id, "path", r.URL.Path)
		http.Error(w, "missing or wrong CSRF token: reload the page", http.StatusForbidden)
		return false
	}
	return true
}

// sameOrigin reports whether a post's Origin (when the browser sends
// one) is the page's own.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// overTLS reports whether the browser reached the page over HTTPS: the
// connection is TLS, or a TLS-terminating proxy in front says so
// (X-Forwarded-Proto: https, or Forwarded: proto=https). A client that
// forges the header on plain HTTP only makes its own cookie Secure, so
// that its browser does not send it back: no one else is weakened.
func overTLS(r *http.Request) bool {
	if r.TLS != nil || strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https") {
		return true
	}
	for _, f := range r.Header.Values("Forwarded") {
		for _, part := range strings.FieldsFunc(f, func(c rune) bool { return c == ';' || c == ',' }) {
			if k, v, ok := strings.Cut(strings.TrimSpace(part), "="); ok && strings.EqualFold(k, "proto") && strings.EqualFold(strings.Trim(v, `"`), "https") {
				return true
			}
		}
	}
	return false
}

func randomString() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// login takes the token from the login form and opens a session: an
// HttpOnly, SameSite=Strict cookie under /admin/.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		http.Error(w, "cross-origin post refused", http.StatusForbidden)
		return
	}
	ok := h.tokenOK(r.PostFormValue("token"))
	if wait, refused := h.limited(r, ok, "form"); refused {
		h.tooMany(w, wait, true)
		return
	}
	if !ok {
		h.render(w, http.StatusUnauthorized, "login", loginPage{Name: h.cfg.Name, Failed: true})
		return
	}
	id, now := randomString(), h.cfg.Now()
	h.mu.Lock()
	for k, s := range h.sessions {
		if now.After(s.expires) {
			delete(h.sessions, k)
		}
	}
	if len(h.sessions) >= maxSessions {
		var oldest string
		for k, s := range h.sessions {
			if oldest == "" || s.created.Before(h.sessions[oldest].created) {
				oldest = k
			}
		}
		delete(h.sessions, oldest)
	}
	h.sessions[id] = &session{csrf: randomString(), created: now, expires: now.Add(sessionTTL)}
	h.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/admin/", HttpOnly: true, Secure: overTLS(r),
		SameSite: http.SameSiteStrictMode, MaxAge: int(sessionTTL / time.Second)})
	h.log.InfoContext(r.Context(), "admin: login", "remote", r.RemoteAddr, "session", sessionID(id))
	http.Redirect(w, r, "/admin/", http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request, u who) {
	if c, err := r.Cookie(cookieName); err == nil {
		h.mu.Lock()
		delete(h.sessions, c.Value)
		h.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/admin/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	h.log.InfoContext(r.Context(), "admin: logout", "remote", r.RemoteAddr, "session", u.id)
	http.Redirect(w, r, "/admin/", http.StatusSeeOther)
}

// whoAttrs are the log attributes of the operator who acts.
func whoAttrs(r *http.Request, u who) []any {
	a := []any{"remote", r.RemoteAddr, "auth", u.via}
	if u.id != "" {
		a = append(a, "session", u.id)
	}
	return a
}

// evict deletes a record, after its confirmation page. The page carries
// the fence and an owner tag of the record the operator confirmed, and
// the confirmed post deletes that record only (idem.ConditionalDeleter,
// where the store has it): a record taken over or replaced meanwhile is
// another execution's, and is kept (409).
func (h *Handler) evict(w http.ResponseWriter, r *http.Request, u who) {
	if h.cfg.Store == nil {
		http.Error(w, "this program cannot evict records", http.StatusNotFound)
		return
	}
	scope, key, ok := formPair(r, "scope", "key")
	if !ok || key == "" {
		http.Error(w, "the form names no record (scope and key)", http.StatusBadRequest)
		return
	}
	confirmed, ok := confirmedRecord(r)
	if !ok {
		http.Error(w, "the form's fence is not a number", http.StatusBadRequest)
		return
	}
	hash := idem.HashKey(scope, key)
	// A record whose lease is live is being executed: deleting it would
	// let a retry run the request again while this execution still runs
	// (its completion then fails, its effect stays). Refused until the
	// lease ends; a record whose holder died is evicted as any other.
	rec, gerr := h.cfg.Store.Get(r.Context(), scope, key)
	if gerr == nil && rec.Status == idem.StatusProcessing && rec.LeaseUntil.After(h.cfg.Now()) {
		h.log.WarnContext(r.Context(), "admin: refused to evict a record being executed", append(whoAttrs(r, u), "key_hash", hash)...)
		http.Error(w, "record "+hash+" is being executed (its lease runs until "+rec.LeaseUntil.UTC().Format(time.RFC3339)+
			"): evicting it would let a retry run the request again while this execution runs; evict it after its lease ends", http.StatusConflict)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		// Only a record read is confirmed: a confirmation naming none
		// would delete, once posted, whatever record the key has by
		// then, which the operator never saw.
		switch {
		case errors.Is(gerr, idem.ErrNotFound):
			http.Error(w, noRecord(hash), http.StatusNotFound)
			return
		case gerr != nil:
			http.Error(w, "cannot read record "+hash+" to confirm its eviction: "+h.redact(gerr, scope, key), http.StatusBadGateway)
			return
		}
		lines := []string{"scope " + quote(scope), "key " + quote(key), h.describe(rec),
			"The record is deleted from the store: a retry with this key runs the request again, as a new one."}
		fields := map[string]string{"scope64": enc(scope), "key64": enc(key),
			"fence": strconv.FormatInt(rec.Fence, 10), "owner": ownerTag(rec.Owner)}
		h.render(w, http.StatusOK, "confirm", confirmPage{Name: h.cfg.Name, CSRF: csrfOf(u), Action: "/admin/evict",
			Title: "Evict record " + hash + "?", Lines: lines, Fields: fields, Button: "Evict"})
		return
	}
	attrs := append(whoAttrs(r, u), "action", "evict", "key_hash", hash)
	if h.cfg.LogKeys {
		attrs = append(attrs, "scope", scope, "key", key)
	}
	notFound := func() {
		// A key typed in with another scope, or evicted already: the
		// operator's mistake, not the store's failure.
		h.log.WarnContext(r.Context(), "admin: evict found no record", attrs...)
		http.Error(w, noRecord(hash), http.StatusNotFound)
	}
	changed := func(now idem.Record, err error) {
		h.log.WarnContext(r.Context(), "admin: evict refused: the record changed since it was confirmed",
			append(attrs, "fence_confirmed", confirmed.fence, "fence_now", now.Fence)...)
		msg := "the record changed since you confirmed: record " + hash + " "
		if confirmed.set {
			msg += "was confirmed at fence " + strconv.FormatInt(confirmed.fence, 10) + " and "
		}
		if err == nil {
			msg += "is now " + h.describe(now) + ", another execution's"
		} else {
			msg += "is now another execution's (" + h.redact(err, scope, key) + ")"
		}
		http.Error(w, msg+"; nothing was deleted. Reload the page and look at it again.", http.StatusConflict)
	}
	failed := func(err error) {
		msg := h.redact(err, scope, key)
		h.log.ErrorContext(r.Context(), "admin: evict failed", append(attrs, "error", msg)...)
		http.Error(w, "evict failed: "+msg, http.StatusBadGateway)
	}
	// The record is read again, and deleted only as read: not when it
	// cannot be read (it could not be compared with the one confirmed),
	// and not when it is another than the one confirmed.
	switch {
	case errors.Is(gerr, idem.ErrNotFound):
		notFound()
		return
	case gerr != nil:
		failed(gerr)
		return
	case confirmed.set && (rec.Fence != confirmed.fence || ownerTag(rec.Owner) != confirmed.owner):
		changed(rec, nil)
		return
	}
	var err error
	if cd, ok := h.cfg.Store.(idem.ConditionalDeleter); ok {
		// Delete the record just read, which is the one confirmed, and
		// nothing that replaced it since.
		err = cd.DeleteIf(r.Context(), scope, key, rec.Owner, rec.Fence)
	} else {
		err = h.cfg.Store.Delete(r.Context(), scope, key)
	}
	switch {
	case errors.Is(err, tieredstore.ErrCacheEntryKept):
		// Deleted from the truth, not from Redis: say so, never "gone".
		failed(err)
		return
	case errors.Is(err, idem.ErrNotFound):
		notFound()
		return
	case errors.Is(err, idem.ErrRecordChanged):
		now, gerr := h.cfg.Store.Get(r.Context(), scope, key)
		if gerr != nil {
			changed(idem.Record{}, err)
		} else {
			changed(now, nil)
		}
		return
	case err != nil:
		failed(err)
		return
	}
	h.log.InfoContext(r.Context(), "admin: record evicted", append(attrs, "fence", rec.Fence)...)
	http.Redirect(w, r, "/admin/?done=evicted&ref="+hash, http.StatusSeeOther)
}

// noRecord is the answer to the eviction of a key without a record.
func noRecord(hash string) string {
	return "no record " + hash + " of this scope and key (evicted already, expired, or another scope)"
}

// confirmation is the record an eviction's confirmation page showed: its
// fence and owner tag, when the page had a record to show.
type confirmation struct {
	set   bool
	fence int64
	owner string
}

// confirmedRecord reads the record a confirmed eviction names; ok is false
// if the fence is malformed. A form typed in names none.
func confirmedRecord(r *http.Request) (confirmation, bool) {
	f, o := r.PostFormValue("fence"), r.PostFormValue("owner")
	if f == "" && o == "" {
		return confirmation{}, true
	}
	fence, err := strconv.ParseInt(f, 10, 64)
	if err != nil {
		return confirmation{}, false
	}
	return confirmation{set: true, fence: fence, owner: o}, true
}

// ownerTag names a record's owner on the confirmation page without
// handing the owner token out: a short SHA-256 of it.
func ownerTag(owner string) string {
	sum := sha256.Sum256([]byte("idem-admin-owner\x00" + owner))
	return hex.EncodeToString(sum[:8])
}

// describe says what state rec is in, for a confirmation page or a
// refusal.
func (h *Handler) describe(rec idem.Record) string {
	if rec.Status != idem.StatusProcessing {
		return fmt.Sprintf("%s at fence %d", rec.Status, rec.Fence)
	}
	lease := "its lease ended "
	if rec.LeaseUntil.After(h.cfg.Now()) {
		lease = "its lease runs until "
	}
	return fmt.Sprintf("processing at fence %d, %s%s", rec.Fence, lease, rec.LeaseUntil.UTC().Format(time.RFC3339))
}

// retry retries a dead message, after its confirmation page.
func (h *Handler) retry(w http.ResponseWriter, r *http.Request, u who) {
	if h.cfg.Retry == nil {
		http.Error(w, "this program cannot retry messages", http.StatusNotFound)
		return
	}
	group, id, ok := formPair(r, "group", "id")
	if !ok || group == "" || id == "" {
		http.Error(w, "the form names no message (group and id)", http.StatusBadRequest)
		return
	}
	hash := idem.HashKey("", id) // as the inbox reports it (its Event.KeyHash)
	if r.PostFormValue("confirm") != "yes" {
		lines := []string{"group " + quote(group), "message " + quote(id)}
		if h.cfg.RetryHelp != "" {
			lines = append(lines, h.cfg.RetryHelp)
		}
		h.render(w, http.StatusOK, "confirm", confirmPage{Name: h.cfg.Name, CSRF: csrfOf(u), Action: "/admin/retry",
			Title: "Retry dead message " + hash + "?", Lines: lines,
			Fields: map[string]string{"group64": enc(group), "id64": enc(id)}, Button: "Retry"})
		return
	}
	attrs := append(whoAttrs(r, u), "action", "retry", "group", group, "message_hash", hash)
	if h.cfg.LogKeys {
		attrs = append(attrs, "message_id", id)
	}
	if err := h.cfg.Retry(r.Context(), group, id); err != nil {
		msg := h.redact(err, "", id)
		h.log.ErrorContext(r.Context(), "admin: retry failed", append(attrs, "error", msg)...)
		status := http.StatusBadGateway
		if errors.Is(err, inbox.ErrNotFound) {
			status = http.StatusConflict
		}
		http.Error(w, "retry failed: "+msg, status)
		return
	}
	h.log.InfoContext(r.Context(), "admin: dead message retried", attrs...)
	http.Redirect(w, r, "/admin/?done=retried&ref="+hash, http.StatusSeeOther)
}

// retryOp makes a dead or waiting operation of steps due now, after its
// confirmation page. A running or done one has nothing to retry (409).
func (h *Handler) retryOp(w http.ResponseWriter, r *http.Request, u who) {
	if h.cfg.Operations == nil {
		http.Error(w, "this program cannot retry operations", http.StatusNotFound)
		return
	}
	scope, key, ok := formPair(r, "scope", "key")
	if !ok || key == "" {
		http.Error(w, "the form names no operation (scope and key)", http.StatusBadRequest)
		return
	}
	hash := idem.HashKey(scope, key) // the idem.key_hash of its record
	refuse := func(state steps.State) {
		why := "an execution holds it, or the completer takes it up if that execution died"
		if state == steps.StateDone {
			why = "its answer is stored in its record"
		}
		http.Error(w, "operation "+hash+" is "+string(state)+": nothing to retry ("+why+")", http.StatusConflict)
	}
	if r.PostFormValue("confirm") != "yes" {
		op, err := h.cfg.Operations.Get(r.Context(), scope, key)
		switch {
		case errors.Is(err, idem.ErrNotFound):
			http.Error(w, noOperation(hash), http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, "cannot read operation "+hash+" to confirm its retry: "+h.redact(err, scope, key), http.StatusBadGateway)
			return
		case op.State == steps.StateRunning || op.State == steps.StateDone:
			refuse(op.State)
			return
		}
		what := fmt.Sprintf("%s after %d attempts", op.State, op.Attempts)
		if op.LastError != "" {
			what += "; last error: " + quote(op.LastError)
		}
		lines := []string{"operation " + quote(op.Name), "scope " + quote(scope), "key " + quote(key), what,
			"The operation is made due now, a dead one with its attempts counted from 0 again: the completer of an instance that defines it resumes it after its last checkpoint on its next pass."}
		h.render(w, http.StatusOK, "confirm", confirmPage{Name: h.cfg.Name, CSRF: csrfOf(u), Action: "/admin/retry-op",
			Title: "Retry operation " + hash + "?", Lines: lines,
			Fields: map[string]string{"scope64": enc(scope), "key64": enc(key)}, Button: "Retry"})
		return
	}
	attrs := append(whoAttrs(r, u), "action", "retry-op", "key_hash", hash)
	if h.cfg.LogKeys {
		attrs = append(attrs, "scope", scope, "key", key)
	}
	err := h.cfg.Operations.Retry(r.Context(), scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		h.log.WarnContext(r.Context(), "admin: retry found no operation", attrs...)
		http.Error(w, noOperation(hash), http.StatusNotFound)
		return
	case errors.Is(err, steps.ErrNotRetryable):
		h.log.WarnContext(r.Context(), "admin: retry refused: the operation is running or done", attrs...)
		state := steps.StateRunning
		if op, gerr := h.cfg.Operations.Get(r.Context(), scope, key); gerr == nil {
			state = op.State
		}
		refuse(state)
		return
	case err != nil:
		msg := h.redact(err, scope, key)
		h.log.ErrorContext(r.Context(), "admin: retry of an operation failed", append(attrs, "error", msg)...)
		http.Error(w, "retry failed: "+msg, http.StatusBadGateway)
		return
	}
	h.log.InfoContext(r.Context(), "admin: operation retried", attrs...)
	http.Redirect(w, r, "/admin/?done=op-retried&ref="+hash, http.StatusSeeOther)
}

// noOperation is the answer to the retry of a key without an operation.
func noOperation(hash string) string {
	return "no operation " + hash + " of this scope and key (swept, or another scope)"
}

// redact returns err's text with scope and key (which a store's error
// may quote) replaced by their hash, unless the operator opted in to
// raw keys.
func (h *Handler) redact(err error, scope, key string) string {
	msg := err.Error()
	if h.cfg.LogKeys {
		return msg
	}
	hash := "<" + idem.HashKey(scope, key) + ">"
	for _, s := range []string{key, scope} {
		if len(s) >= 3 {
			msg = strings.ReplaceAll(msg, s, hash)
		}
	}
	return msg
}

// formPair reads two fields of a post, base64url-encoded under NAME64
// (the page's buttons: keys of any bytes round-trip) or as they are
// under NAME (a form typed in).
func formPair(r *http.Request, a, b string) (string, string, bool) {
	read := func(name string) (string, bool) {
		if v := r.PostFormValue(name + "64"); v != "" {
			d, err := base64.RawURLEncoding.DecodeString(v)
			return string(d), err == nil
		}
		return r.PostFormValue(name), true
	}
	x, ok1 := read(a)
	y, ok2 := read(b)
	return x, y, ok1 && ok2
}

func enc(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func csrfOf(u who) string {
	if u.sess == nil {
		return ""
	}
	return u.sess.csrf
}

func (h *Handler) countersJSON(w http.ResponseWriter) {
	var out []Count
	if h.cfg.Counters != nil {
		out = h.cfg.Counters.Snapshot()
	}
	if out == nil {
		out = []Count{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
