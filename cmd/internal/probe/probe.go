package probe

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Defaults of Config.
const (
	// DefaultConcurrency is the number of concurrent requests with one key
	// of the concurrent check.
	DefaultConcurrency = 10
	// DefaultKeyHeader is the request header that carries the key.
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultMaxKeyLen is the longest key the API is expected to take
	// (Stripe's and idem's limit): the overlong check sends one byte more.
	DefaultMaxKeyLen = 255
	// DefaultTimeout bounds each request.
	DefaultTimeout = 30 * time.Second
	// DefaultEffectSettle is how long the probe waits after the last
	// check before it reads the effect once more.
	DefaultEffectSettle = time.Second
	// MaxConcurrency is the largest Config.Concurrency.
	MaxConcurrency = 1000
)

// ReplayedHeader ("true") is the response header that marks a replay, as
// Stripe and idemhttp send it. The draft defines no marker: the core
// checks recognise a replay by its answer (the first answer again) and
// report a marker under any of ReplayedHeaders; the stripe profile
// requires this one.
const ReplayedHeader = "Idempotent-Replayed"

// ReplayedHeaders are the names under which implementations mark a replay
// (with the value "true"), ReplayedHeader first.
var ReplayedHeaders = []string{ReplayedHeader, "Idempotency-Replayed", "X-Idempotent-Replayed", "X-Idempotency-Replayed"}

// Profiles are the profiles a check may belong to besides the core:
//
//   - stripe: Stripe's practice: the Idempotent-Replayed marker, 409 to
//     concurrent duplicates, a fingerprint insensitive to the order of
//     JSON members.
//   - strict-keys: a bare key is the key its quoted form names; empty and
//     non-UTF-8 keys are refused.
//   - retry-safe: an answer a client is meant to retry (5xx) is not kept,
//     so the retry runs again; a 409 says when to retry (Retry-After).
//   - problem-details: the refusals of the key (400, 409, 422) are RFC
//     9457 problem details.
var Profiles = []string{"stripe", "strict-keys", "retry-safe", "problem-details"}

// maxAnswer is the largest response body the probe reads; more is an error.
const maxAnswer = 16 << 20

// keptAnswer is how much of an answer's body the probe keeps (for a
// reason's excerpt, a problem detail's members): answers are compared by
// their length and SHA-256, so that -n concurrent answers of up to
// maxAnswer each never sit in memory at once. The effect's answer, whose
// count is read, is kept whole.
const keptAnswer = 64 << 10

// maxAnswerHeader bounds an answer's header block, with the probe's own
// client.
const maxAnswerHeader = 1 << 20

// Config says what to probe and how. The zero value of each field means
// its default; URL is required.
type Config struct {
	// URL is the endpoint whose requests carry idempotency keys (POST
	// https://api.example.com/v1/orders). http and https only.
	URL string
	// Method is the request method; "" means POST. GET, HEAD, OPTIONS
	// and TRACE are refused: they are idempotent without any key.
	Method string
	// Header holds the headers sent with every request (authentication,
	// a tenant, Content-Type). It must not hold the key header. An
	// Accept-Encoding is not sent: the probe asks for gzip and reads
	// answers decoded. With a
	// Body and no Content-Type the probe sends application/json for a JSON
	// body and application/x-www-form-urlencoded otherwise, as curl -d.
	Header http.Header
	// Body is the body of a request the API accepts (2xx) and executes.
	Body []byte
	// RefusedBody, when not nil, is a body the API refuses with a 4xx
	// other than 401, 403, 407, 408, 409, 425 and 429, without
	// Retry-After (an unknown product, say): the stored-4xx check sends
	// it twice under one key. Nil makes that check not applicable.
	RefusedBody []byte
	// ServerErrorBody, when not nil, is a body the API answers with a 5xx
	// (a payment the provider fails, say): the released-5xx check sends
	// it under a key, then the accepted Body under the same key, which
	// must execute. Nil makes that check not applicable.
	ServerErrorBody []byte
	// KeyRequired says that the API requires a key on this endpoint: a
	// request without one must be refused with 400. False makes a keyless
	// request that executes not applicable (the API runs it unguarded).
	KeyRequired bool
	// OtherHeader, when not nil, holds the headers of a second caller
	// (its credentials or identity): each replaces the Header of the same
	// name (and the EffectHeader's, for the second caller's reads of the
	// effect; when the second caller may not read it, as an effect at a
	// URL that names the first caller, it is read as the first caller). The scoped-keys check sends the first caller's key as the
	// second caller: it must never get the first caller's answer. Nil
	// makes that check not applicable.
	OtherHeader http.Header
	// Retention is how long the API documents that it keeps a key's
	// answer. When not 0, the expiry check sends a key at the start, then
	// again before the retention ends (it must replay) and after it (it
	// must execute again): the run lasts at least Retention.
	Retention time.Duration
	// Concurrency is the number of concurrent requests with one key; 0
	// means DefaultConcurrency; at most MaxConcurrency.
	Concurrency int
	// KeyHeader is the name of the key's header; "" means Idempotency-Key.
	KeyHeader string
	// MaxKeyLen is the longest key the API documents; the overlong check
	// sends a key one byte longer. 0 means DefaultMaxKeyLen.
	MaxKeyLen int
	// Timeout bounds each request (and each read of the effect); 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// EffectURL, with EffectPath, is read with GET before and after each
	// check: the count at EffectPath in its JSON answer must move exactly
	// once per key an answer shows executed. Both or neither.
	EffectURL string
	// EffectPath selects the count in EffectURL's answer (see Path).
	EffectPath string
	// EffectHeader holds the headers of the effect's GET; nil means Header
	// (without Content-Type).
	EffectHeader http.Header
	// EffectSettle is how long the probe waits after the last check
	// before it reads the effect once more, so that an execution that
	// lands after its answer (a duplicate run on another node) is
	// counted; 0 means DefaultEffectSettle, a negative value reads it
	// right after the last check.
	EffectSettle time.Duration
	// Insecure skips the verification of the server's TLS certificate.
	Insecure bool
	// Client sends the requests; nil means a client of the probe's own
	// (which follows no redirect). A Client's Timeout and redirect policy
	// are its own.
	Client *http.Client
	// Profiles names the profiles (of Profiles) the caller requires: a
	// failed check of one makes Report.OK false. Checks of every profile
	// run and are reported whether required or not.
	Profiles []string
	// Progress, when not nil, is called after each request with the
	// number of requests sent and the number planned (which retries after
	// 409 can pass: done may exceed total). Calls are serialised.
	Progress func(done, total int)

	otherEffectHeader http.Header // EffectHeader with OtherHeader's names replaced
}

// MinRetention is the shortest Config.Retention: the expiry check must
// tell "before the retention" from "after it" across the time requests
// take.
const MinRetention = time.Second

// representationHeaders describe a request's content or the answer it
// wants, never who sends it: a second caller that differs only in them is
// the first caller again.
var representationHeaders = map[string]bool{
	"Content-Type": true, "Content-Length": true, "Content-Encoding": true, "Content-Language": true,
	"Accept": true, "Accept-Encoding": true, "Accept-Language": true, "Accept-Charset": true,
	"User-Agent": true, "Cache-Control": true, "Pragma": true, "Connection": true,
}

// overlay returns h with each header of over replacing h's of that name.
func overlay(h, over http.Header) http.Header {
	out := h.Clone()
	if out == nil {
		out = http.Header{}
	}
	for name, v := range over {
		out[http.CanonicalHeaderKey(name)] = slices.Clone(v)
	}
	return out
}

// canonical returns a copy of h with each name in its canonical form (the
// values of names that differ only in case together); nil for nil.
func canonical(h http.Header) http.Header {
	if h == nil {
		return nil
	}
	out := make(http.Header, len(h))
	for name, v := range h {
		k := http.CanonicalHeaderKey(name)
		out[k] = append(out[k], v...)
	}
	return out
}

// badHeader says what in h no request can carry (a name that is not a
// token, a value with a control character other than a tab: a line
// break would end the header); "" when nothing.
func badHeader(h http.Header) string {
	for name, values := range h {
		if !isToken(name) {
			return fmt.Sprintf("%q is not a header name", name)
		}
		for _, v := range values {
			if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
				return fmt.Sprintf("%s: %q holds a control character; a header's value is one line of text", name, v)
			}
		}
	}
	return ""
}

// ConfigError is a Config the probe cannot run with: Field names the
// field, Msg says what is wrong and how to fix it.
type ConfigError struct {
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return "probe: " + e.Field + ": " + e.Msg }

// NotAcceptedError reports that the first request, with a fresh key and the
// Config's method, headers and body, was not answered 2xx: the checks need
// a request the API accepts. Err is set when no answer came at all.
type NotAcceptedError struct {
	Status int
	Body   string // the start of the answer's body
	// Location is where a redirect (3xx) pointed: the probe follows
	// none, so the URL to probe is that one.
	Location string
	Err      error
}

func (e *NotAcceptedError) Error() string {
	switch {
	case e.Err != nil:
		return "the first request got no answer: " + e.Err.Error()
	case e.Location != "":
		return fmt.Sprintf("the first request, with a fresh key, was answered %s to %s: the probe follows no redirect, probe the URL it points to", statusText(e.Status), e.Location)
	case e.Body == "":
		return fmt.Sprintf("the first request, with a fresh key, was answered %s, with no body", statusText(e.Status))
	}
	return fmt.Sprintf("the first request, with a fresh key, was answered %s: %s", statusText(e.Status), e.Body)
}

func (e *NotAcceptedError) Unwrap() error { return e.Err }

// EffectError reports a read of the effect that failed: no answer, not
// 2xx, or no count at the path.
type EffectError struct {
	URL    string
	Status int // 0 when no answer came
	Msg    string
}

func (e *EffectError) Error() string {
	if e.Status == 0 {
		return "GET " + e.URL + ": " + e.Msg
	}
	return fmt.Sprintf("GET %s answered %s: %s", e.URL, statusText(e.Status), e.Msg)
}

// Status is the outcome of a check.
type Status string

// Outcomes of a check.
const (
	Pass          Status = "pass"
	Fail          Status = "fail"
	NotApplicable Status = "n/a"
	// Warning is an answer the draft allows but that weakens the
	// protection (a lenient key validation, a replay a client cannot tell
	// from an execution): reported, never failed.
	Warning Status = "warning"
)

// Grades of a check.
const (
	// Core checks are the draft's MUST and SHOULD: they decide whether
	// the API is idempotent.
	Core = "core"
	// Profile checks are a house style (Result.Profile names it): they
	// fail only the profile.
	Profile = "profile"
)

// Result is the outcome of one check.
type Result struct {
	// ID is the check's stable name (see Checks).
	ID string `json:"id"`
	// Title says what the check expects.
	Title string `json:"title"`
	// Grade is Core or Profile.
	Grade string `json:"grade"`
	// Profile names the check's profile (of Profiles); "" for core.
	Profile string `json:"profile,omitempty"`
	// Status is pass, fail, n/a or warning.
	Status Status `json:"status"`
	// Reason says what the API answered, and why that passes, fails or
	// does not apply.
	Reason string `json:"reason"`
	// Source is where the expectation comes from.
	Source string `json:"source"`
	// Requests is the number of requests the check sent.
	Requests int `json:"requests"`
	// Executions is the number of executions the answers show: a 2xx
	// answer is one unless it repeats, byte for byte, an earlier answer
	// under its key or is marked a replay (keyless 2xx answers are one
	// each).
	Executions int `json:"executions"`
	// OtherExecutions is the number of executions of the second caller
	// (Config.OtherHeader) the answers show.
	OtherExecutions int `json:"other_executions,omitempty"`
	// EffectDelta is how much the effect's count moved during the check;
	// nil without Config.EffectURL. It must be Executions, or Executions
	// plus OtherExecutions (a count of every caller's effects).
	EffectDelta *int64 `json:"effect_delta,omitempty"`
}

// Effect is what the effect's count did over the whole run.
type Effect struct {
	URL      string `json:"url"`
	Path     string `json:"path"`
	Before   int64  `json:"before"`
	After    int64  `json:"after"`
	Expected int64  `json:"expected"`
}

// Report is the outcome of a run.
type Report struct {
	URL         string   `json:"url"`
	Method      string   `json:"method"`
	KeyHeader   string   `json:"key_header"`
	RunID       string   `json:"run_id"`
	Concurrency int      `json:"concurrency"`
	Checks      []Result `json:"checks"`
	Effect      *Effect  `json:"effect,omitempty"`
	Requests    int      `json:"requests"`
	Passed      int      `json:"passed"`
	Failed      int      `json:"failed"`
	NA          int      `json:"not_applicable"`
	Warnings    int      `json:"warnings"`
	// CoreOK is true when no core check failed: the API holds the draft.
	CoreOK bool `json:"core_ok"`
	// Profiles is the outcome of each profile, in the order of Profiles.
	Profiles []ProfileResult `json:"profiles"`
	// OK is true when CoreOK is and no required profile failed.
	OK         bool  `json:"ok"`
	DurationMS int64 `json:"duration_ms"`
}

// ProfileResult is the outcome of a profile's checks.
type ProfileResult struct {
	Name string `json:"name"`
	// Required is true when Config.Profiles names it.
	Required bool `json:"required"`
	// OK is true when none of its checks failed.
	OK bool `json:"ok"`
	// Failed are the IDs of its checks that failed.
	Failed []string `json:"failed,omitempty"`
}

// Run probes the API that cfg describes and returns the report. Its error
// is a *ConfigError for a Config it cannot use, a *NotAcceptedError when
// the API does not accept the first request, an *EffectError when the
// effect cannot be read, or the context's error.
func Run(ctx context.Context, cfg *Config) (*Report, error) {
	if cfg == nil {
		return nil, &ConfigError{Field: "URL", Msg: "required"}
	}
	c := *cfg
	if err := c.normalize(); err != nil {
		return nil, err
	}
	p, err := newProber(&c)
	if err != nil {
		return nil, err
	}
	defer p.close()
	rep, err := p.run(ctx)
	if err != nil && ctx.Err() != nil {
		// A request or a read of the effect cut short by the context
		// says nothing of the API: the run was interrupted.
		return nil, ctx.Err()
	}
	return rep, err
}

func (c *Config) normalize() error {
	if c.URL == "" {
		return &ConfigError{Field: "URL", Msg: "required: the endpoint whose requests carry the key (https://api.example.com/orders)"}
	}
	if err := checkURL(c.URL); err != nil {
		return &ConfigError{Field: "URL", Msg: err.Error()}
	}
	if c.Method == "" {
		c.Method = http.MethodPost
	}
	if !isToken(c.Method) {
		return &ConfigError{Field: "Method", Msg: fmt.Sprintf("%q is not an HTTP method; give POST, PATCH, PUT or DELETE", c.Method)}
	}
	switch strings.ToUpper(c.Method) {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return &ConfigError{Field: "Method", Msg: fmt.Sprintf("%s is idempotent without a key; probe the method that changes something (POST, PATCH)", c.Method)}
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if !isToken(c.KeyHeader) {
		return &ConfigError{Field: "KeyHeader", Msg: fmt.Sprintf("%q is not a header name", c.KeyHeader)}
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 2 || c.Concurrency > MaxConcurrency {
		return &ConfigError{Field: "Concurrency", Msg: fmt.Sprintf("%d is out of range; give 2 to %d", c.Concurrency, MaxConcurrency)}
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = DefaultMaxKeyLen
	}
	if c.MaxKeyLen < keyLen || c.MaxKeyLen > 1<<16 {
		return &ConfigError{Field: "MaxKeyLen", Msg: fmt.Sprintf("%d is out of range; the probe's keys are %d bytes, give %d to %d", c.MaxKeyLen, keyLen, keyLen, 1<<16)}
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	for _, name := range c.Profiles {
		if !slices.Contains(Profiles, name) {
			return &ConfigError{Field: "Profiles", Msg: fmt.Sprintf("%q is not a profile; give %s", name, strings.Join(Profiles, ", "))}
		}
	}
	if c.Timeout < 0 {
		return &ConfigError{Field: "Timeout", Msg: "negative; give a positive duration (30s)"}
	}
	if c.Retention < 0 {
		return &ConfigError{Field: "Retention", Msg: "negative; give the API's documented retention (24h), or 0 to skip the expiry check"}
	}
	if c.Retention > 0 && c.Retention < MinRetention {
		return &ConfigError{Field: "Retention", Msg: fmt.Sprintf("%v is too short to tell from the time a request takes; give %v or more", c.Retention, MinRetention)}
	}
	// Names as written (a map literal in lower case) name the header
	// they spell: canonical, a header the probe sets or replaces is that
	// one, not one more beside it. canonical copies: the caller's maps
	// are never changed.
	c.Header, c.OtherHeader, c.EffectHeader = canonical(c.Header), canonical(c.OtherHeader), canonical(c.EffectHeader)
	for _, h := range []struct {
		field string
		h     http.Header
	}{{"Header", c.Header}, {"OtherHeader", c.OtherHeader}, {"EffectHeader", c.EffectHeader}} {
		if msg := badHeader(h.h); msg != "" {
			return &ConfigError{Field: h.field, Msg: msg}
		}
	}
	if c.Header == nil {
		c.Header = http.Header{}
	}
	for name := range c.Header {
		if strings.EqualFold(name, c.KeyHeader) {
			return &ConfigError{Field: "Header", Msg: fmt.Sprintf("holds %s; the probe sends keys of its own, remove it", c.KeyHeader)}
		}
	}
	if len(c.Body) > 0 && c.Header.Get("Content-Type") == "" {
		c.Header.Set("Content-Type", defaultContentType(c.Body))
	}
	if c.OtherHeader != nil {
		if len(c.OtherHeader) == 0 {
			return &ConfigError{Field: "OtherHeader", Msg: "empty; give the second caller's credentials or identity (X-User-ID: 43)"}
		}
		identity := false
		for name, v := range c.OtherHeader {
			if strings.EqualFold(name, c.KeyHeader) {
				return &ConfigError{Field: "OtherHeader", Msg: fmt.Sprintf("holds %s; the probe sends keys of its own, remove it", c.KeyHeader)}
			}
			if !slices.Equal(c.Header.Values(name), v) && !representationHeaders[name] {
				identity = true
			}
		}
		if !identity {
			return &ConfigError{Field: "OtherHeader", Msg: "names no header of identity the first caller sends otherwise (Content-Type, Accept and their kin describe the request, not who sends it); give the second caller's own credentials or identity"}
		}
	}
	if (c.EffectURL == "") != (c.EffectPath == "") {
		if c.EffectURL == "" {
			return &ConfigError{Field: "EffectURL", Msg: "required with EffectPath: the URL whose JSON holds the count"}
		}
		return &ConfigError{Field: "EffectPath", Msg: "required with EffectURL: where the count is in its JSON (count, data.total, orders.#)"}
	}
	if c.EffectURL != "" {
		if err := checkURL(c.EffectURL); err != nil {
			return &ConfigError{Field: "EffectURL", Msg: err.Error()}
		}
		if _, err := ParsePath(c.EffectPath); err != nil {
			return &ConfigError{Field: "EffectPath", Msg: err.Error()}
		}
		if c.EffectHeader == nil {
			c.EffectHeader = c.Header.Clone()
			c.EffectHeader.Del("Content-Type")
		}
		c.otherEffectHeader = overlay(c.EffectHeader, c.OtherHeader)
		c.otherEffectHeader.Del("Content-Type")
	}
	return nil
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %v", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q is not an http:// or https:// URL", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	return nil
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// keyLen is the length of the probe's keys: a UUID's 36 characters.
const keyLen = 36

// prober runs one probe.
type prober struct {
	cfg    *Config
	client *http.Client
	own    *http.Transport // closed at the end when the client is the probe's
	runID  string
	path   Path

	mu        sync.Mutex
	seen      map[string][]*answer // per key, the answers counted as executions
	log       map[string][]*answer // per key, every answer, in the order sent
	keys      []string             // the keys of log, in the order first sent
	sent      int
	planned   int
	effectOn  bool
	lastCount int64

	// State shared between checks: a profile check judges the answers a
	// core check got.
	concurrentKey string
	concurrent    []*answer
	inFlight      []*answer // the 409s of the concurrent checks
	execTime      time.Duration
	replays       []*answer // answers that repeated a first answer (retries, the stored 4xx)
	mismatch      *mismatchState
	quoted        *quotedState
	lenient       []string     // malformed keys taken: what they were and what they got
	refusals      []refusal    // the answers that refused a key (400, 409, 422)
	expiry        *expiryState // the expiry check's first request
	started       map[string]*check
}

// refusal is an answer that refused a key, for the problem-details
// profile: what was sent, and what came back.
type refusal struct {
	what string
	a    *answer
}

// noteRefusal keeps a, when it is a 400, 409 or 422, as a refusal of
// what.
func (p *prober) noteRefusal(what string, a *answer) {
	if a.err != nil {
		return
	}
	switch a.status {
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity:
		p.mu.Lock()
		p.refusals = append(p.refusals, refusal{what: what, a: a})
		p.mu.Unlock()
	}
}

type quotedState struct {
	key   string // unquoted
	first *answer
}

// mismatchState is the mismatch check's key: the other body it sent
// first, and what that body got.
type mismatchState struct {
	key     string
	body    []byte    // the other body the API accepted; nil when it took none
	first   *answer   // its answer
	refused []*answer // the answers of the other bodies refused under a fresh key
	got422  bool
}

func newProber(c *Config) (*prober, error) {
	p := &prober{cfg: c, client: c.Client, runID: randomHex(4), seen: map[string][]*answer{}, log: map[string][]*answer{},
		effectOn: c.EffectURL != "", started: map[string]*check{}}
	if p.effectOn {
		p.path, _ = ParsePath(c.EffectPath)
	}
	if p.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = c.Concurrency
		// Every answer's headers are kept for the run: bound them as the
		// bodies are (Go's default is 10 MB).
		tr.MaxResponseHeaderBytes = maxAnswerHeader
		if c.Insecure {
			tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		}
		p.own = tr
		p.client = &http.Client{
			Transport: tr,
			// An answer is judged as it is: a redirect is not followed,
			// as curl does not.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	p.planned = 3 + c.Concurrency + c.Concurrency + 2 + 1 + 2 + 2 + 2 + 2 + 1 + 1 + len(malformedKeys) + 1 + 2 + 6
	if c.ServerErrorBody != nil {
		p.planned += 3
	}
	if c.OtherHeader != nil {
		p.planned += 5
	}
	if c.Retention > 0 {
		p.planned += 3
	}
	return p, nil
}

func (p *prober) close() {
	if p.own != nil {
		p.own.CloseIdleConnections()
	}
}

// newKey returns a fresh key: a version 4 UUID whose first group is the
// run's id (the form most APIs take: Stripe's and idem's any string of up
// to 255 bytes, fiber's and others' 36 characters, Square's 45).
func (p *prober) newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return p.runID + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// request is one request a check sends.
type request struct {
	method string // "" means the Config's
	url    string // "" means the Config's
	body   []byte
	// keyName and keyValue are the key's header as sent; keyName ""
	// sends no key.
	keyName, keyValue string
	// key names the record the answers belong to: a 2xx answer is an
	// execution unless it repeats an earlier one under key or is marked a
	// replay. "" counts each 2xx answer as one.
	key string
	// get marks a GET: its answers count no execution.
	get bool
	// other sends the request as the second caller (Config.OtherHeader):
	// its executions are the check's other ones.
	other bool
	// whole keeps the answer's body whole (up to maxAnswer), not its
	// first keptAnswer bytes: the effect's, whose count is read.
	whole bool
}

// answer is what a request got.
type answer struct {
	status int
	header http.Header
	body   []byte // the body's first keptAnswer bytes (the effect's: all of it)
	size   int64  // the body's length
	sum    [sha256.Size]byte
	err    error
	took   time.Duration // from sending the request to the end of the answer
}

// sameBody reports whether a and b have the same body.
func (a *answer) sameBody(b *answer) bool { return a.size == b.size && a.sum == b.sum }

func (a *answer) ok() bool { return a.err == nil && a.status >= 200 && a.status <= 299 }

// replayed reports whether a is marked a replay under any of
// ReplayedHeaders.
func (a *answer) replayed() bool {
	name, value := a.marker()
	return name != "" && strings.EqualFold(value, "true")
}

// marker returns the first of ReplayedHeaders that a carries, and its
// value; "" when none.
func (a *answer) marker() (name, value string) {
	if a.err != nil {
		return "", ""
	}
	for _, h := range ReplayedHeaders {
		if v := a.header.Values(h); len(v) > 0 {
			return h, v[0]
		}
	}
	return "", ""
}

// stripeMarked reports whether a carries Idempotent-Replayed: true.
func (a *answer) stripeMarked() bool {
	return a.err == nil && strings.EqualFold(a.header.Get(ReplayedHeader), "true")
}

// same reports whether b repeats a: status, Content-Type, Location and
// body byte for byte.
func (a *answer) same(b *answer) bool {
	return a.err == nil && b.err == nil && a.status == b.status &&
		a.header.Get("Content-Type") == b.header.Get("Content-Type") &&
		a.header.Get("Location") == b.header.Get("Location") &&
		a.sameBody(b)
}

// String describes the answer in a reason: its status and the start of
// its body, or its error.
func (a *answer) String() string {
	if a.err != nil {
		return "no answer (" + a.err.Error() + ")"
	}
	s := statusText(a.status)
	if name, value := a.marker(); name != "" {
		s += " marked " + name + ": " + printable(value)
	}
	if a.size > 0 {
		s += " " + excerpt(a.body)
	}
	return s
}

func statusText(status int) string {
	if t := http.StatusText(status); t != "" {
		return strconv.Itoa(status) + " " + t
	}
	return strconv.Itoa(status)
}

// excerpt returns the start of body, on one line, for a reason: printable
// (see printable), and cut after 120 bytes.
func excerpt(body []byte) string {
	const max = 120
	s := string(body)
	if !utf8.ValidString(s) {
		return fmt.Sprintf("(%d bytes, not UTF-8)", len(body))
	}
	s = printable(strings.Join(strings.Fields(s), " "))
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// printable returns s, a text an API sent, with what a terminal would
// not print as text escaped as Go escapes it: control characters (an
// escape sequence would reach the terminal of whoever reads the report),
// bidirectional controls (which reorder what is shown) and bytes that are
// not UTF-8.
func printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// check is the state of the check running.
type check struct {
	p          *prober
	mu         sync.Mutex
	requests   int
	executions int
	// other is the executions of the second caller: the effect's count
	// moves by them too when it counts every caller, not by them when it
	// counts the first caller's only.
	other int
	// startDelta is how much the effect moved while the check's start
	// phase ran (Info.start).
	startDelta int64
}

// send sends rq and returns its answer (never nil; a failed request has
// err set).
func (c *check) send(ctx context.Context, rq request) *answer {
	p := c.p
	method := rq.method
	if method == "" {
		method = p.cfg.Method
	}
	target := rq.url
	if target == "" {
		target = p.cfg.URL
	}
	a := p.do(ctx, method, target, rq, p.headerFor(rq))
	c.mu.Lock()
	c.requests++
	if !rq.get {
		p.mu.Lock()
		if rq.key != "" {
			if _, ok := p.log[rq.key]; !ok {
				p.keys = append(p.keys, rq.key)
			}
			p.log[rq.key] = append(p.log[rq.key], a)
		}
		if a.ok() && p.isExecution(rq.key, a) {
			if rq.other {
				c.other++
			} else {
				c.executions++
			}
		}
		p.mu.Unlock()
	}
	c.mu.Unlock()
	p.progress()
	return a
}

// sendAtOnce sends n requests at once, the i-th made by rq(i), and
// returns their answers in that order: every goroutine is started
// before any sends.
func (c *check) sendAtOnce(ctx context.Context, n int, rq func(i int) request) []*answer {
	answers := make([]*answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = c.send(ctx, rq(i))
		})
	}
	close(start)
	wg.Wait()
	return answers
}

// settle sends rq and, while it is answered 409 (the key's first request
// still running), sends it again after the answer's Retry-After (50 ms to
// 1 s), up to 8 times: a sequential retry must not be judged by a
// completion the API stores after answering.
func (c *check) settle(ctx context.Context, rq request) *answer {
	a := c.send(ctx, rq)
	for i := 0; i < 8 && a.err == nil && a.status == http.StatusConflict; i++ {
		c.p.noteRefusal("a retry of a request still running", a)
		wait := 50 * time.Millisecond << i
		if s, err := strconv.Atoi(a.header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		wait = min(max(wait, 50*time.Millisecond), time.Second)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return &answer{err: ctx.Err()}
		case <-t.C:
		}
		a = c.send(ctx, rq)
	}
	return a
}

// keyed returns a request of the Config's body under key, sent in the
// key header's own spelling.
func (c *check) keyed(key string) request {
	return request{body: c.p.cfg.Body, keyName: c.p.cfg.KeyHeader, keyValue: key, key: key}
}

// isExecution reports whether a, a 2xx answer under key, shows an
// execution: it is not marked a replay and repeats no answer counted under
// key before (answers with ids of their own are executions of their own,
// even under one key). Keyless answers are one each. p.mu is held.
func (p *prober) isExecution(key string, a *answer) bool {
	if key == "" {
		return true
	}
	if a.replayed() {
		return false
	}
	for _, b := range p.seen[key] {
		if b.same(a) {
			return false
		}
	}
	p.seen[key] = append(p.seen[key], a)
	return true
}

func (p *prober) headerFor(rq request) http.Header {
	h := p.cfg.Header.Clone()
	if rq.other {
		h = overlay(h, p.cfg.OtherHeader)
	}
	if rq.get {
		h.Del("Content-Type")
	}
	if rq.keyName != "" {
		// Set as spelled: the header-case check sends other spellings.
		h[rq.keyName] = []string{rq.keyValue}
	}
	return h
}

func (p *prober) do(ctx context.Context, method, target string, rq request, h http.Header) *answer {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	var body io.Reader
	if len(rq.body) > 0 && !rq.get {
		body = bytes.NewReader(rq.body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return &answer{err: err}
	}
	req.Header = h
	if host := h.Get("Host"); host != "" {
		req.Host = host
		h.Del("Host")
	}
	// Answers are judged by what they say, not by how they travel: the
	// transport asks for gzip and decodes it, where an Accept-Encoding
	// of the caller's (copied from a browser: gzip, deflate, br) would
	// leave the bytes encoded, the effect unreadable.
	h.Del("Accept-Encoding")
	start := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		return &answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	keep := keptAnswer
	if rq.whole {
		keep = maxAnswer
	}
	sum := sha256.New()
	kept := &prefixBuffer{max: keep}
	n, err := io.Copy(io.MultiWriter(sum, kept), io.LimitReader(resp.Body, maxAnswer+1))
	if err == nil && n > maxAnswer {
		err = fmt.Errorf("the answer's body is over %d bytes", maxAnswer)
	}
	if err != nil {
		return &answer{err: fmt.Errorf("reading the answer: %w", err)}
	}
	a := &answer{status: resp.StatusCode, header: resp.Header, body: kept.b, size: n, took: time.Since(start)}
	sum.Sum(a.sum[:0])
	return a
}

// prefixBuffer keeps the first max bytes written to it, and takes the
// rest without keeping it.
type prefixBuffer struct {
	b   []byte
	max int
}

func (w *prefixBuffer) Write(p []byte) (int, error) {
	if room := w.max - len(w.b); room > 0 {
		w.b = append(w.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (p *prober) progress() {
	if p.cfg.Progress == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent++
	p.cfg.Progress(p.sent, p.planned)
}

// count reads the effect's count, as the first caller.
func (p *prober) count(ctx context.Context) (int64, error) {
	return p.countAs(ctx, false)
}

// countAs reads the effect's count as the first caller, or as the second
// (other).
func (p *prober) countAs(ctx context.Context, other bool) (int64, error) {
	h := p.cfg.EffectHeader
	if other {
		h = p.cfg.otherEffectHeader
	}
	a := p.do(ctx, http.MethodGet, p.cfg.EffectURL, request{get: true, whole: true}, h.Clone())
	if a.err != nil {
		return 0, &EffectError{URL: p.cfg.EffectURL, Msg: a.err.Error()}
	}
	if !a.ok() {
		return 0, &EffectError{URL: p.cfg.EffectURL, Status: a.status, Msg: excerpt(a.body)}
	}
	n, err := p.path.Count(a.body)
	if err != nil {
		return 0, &EffectError{URL: p.cfg.EffectURL, Status: a.status, Msg: "path " + p.path.String() + ": " + err.Error()}
	}
	return n, nil
}

func (p *prober) run(ctx context.Context) (*Report, error) {
	start := time.Now()
	rep := &Report{URL: p.cfg.URL, Method: p.cfg.Method, KeyHeader: p.cfg.KeyHeader, RunID: p.runID, Concurrency: p.cfg.Concurrency}
	var before int64
	if p.effectOn {
		n, err := p.count(ctx)
		if err != nil {
			return nil, err
		}
		before, p.lastCount = n, n
	}
	var expected int64
	for i, info := range Checks {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if info.ID == "effect" {
			continue
		}
		c := p.started[info.ID]
		if c == nil {
			c = &check{p: p}
		}
		status, reason, err := info.run(ctx, c)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			// A check cut short by the context is no verdict.
			return nil, err
		}
		r := info.result()
		r.Status, r.Reason, r.Requests, r.Executions, r.OtherExecutions = status, reason, c.requests, c.executions, c.other
		want := int64(c.executions)
		if p.effectOn {
			n, err := p.count(ctx)
			if err != nil {
				return nil, err
			}
			d := n - p.lastCount + c.startDelta
			p.lastCount = n
			r.EffectDelta = &d
			switch {
			case d == want:
			case c.other > 0 && d == want+int64(c.other):
				// The count is every caller's: the second caller's
				// executions moved it too.
				want = d
			default:
				but := "; but"
				if r.Status == Fail {
					but = "; and"
				}
				r.Status = Fail
				r.Reason += fmt.Sprintf("%s the effect moved by %d where the answers show %s", but, d, executionsText(c.executions))
				if c.other > 0 {
					r.Reason += fmt.Sprintf(" (and %s of the second caller)", executionsText(c.other))
				}
			}
		}
		expected += want
		rep.Requests += c.requests
		rep.Checks = append(rep.Checks, r)
		if i == 0 {
			// The first check proved the API accepts the request: the
			// checks that span the run send their first requests now.
			if err := p.startChecks(ctx); err != nil {
				return nil, err
			}
		}
	}
	eff := effectInfo.result()
	if p.effectOn {
		// An execution the answers do not show may land a moment after
		// its request was answered (a duplicate run on another node):
		// the count is read once more after a quiet while, so that one
		// of the last check lands in the run.
		var late int64
		if settle := p.cfg.EffectSettle; settle >= 0 {
			if settle == 0 {
				settle = DefaultEffectSettle
			}
			if err := sleepUntil(ctx, time.Now().Add(settle)); err != nil {
				return nil, err
			}
			n, err := p.count(ctx)
			if err != nil {
				return nil, err
			}
			late = n - p.lastCount
			p.lastCount = n
		}
		rep.Effect = &Effect{URL: p.cfg.EffectURL, Path: p.path.String(), Before: before, After: p.lastCount, Expected: expected}
		moved := p.lastCount - before
		eff.EffectDelta = &moved
		eff.Executions = int(expected)
		if moved == expected {
			eff.Status = Pass
			eff.Reason = fmt.Sprintf("%s at %s went from %d to %d: once per execution the answers show (%d)", p.path, p.cfg.EffectURL, before, p.lastCount, expected)
		} else {
			eff.Status = Fail
			eff.Reason = fmt.Sprintf("%s at %s went from %d to %d, by %d, where the answers show %s", p.path, p.cfg.EffectURL, before, p.lastCount, moved, executionsText(int(expected)))
			if late != 0 {
				eff.Reason += fmt.Sprintf(" (by %d after the last check: effects that landed after their answers)", late)
			}
		}
	} else {
		eff.Status = NotApplicable
		eff.Reason = "no effect to read: give -effect-url and -effect-json-path (a count the request moves) to tell executions from replays by the data, not by the answers alone"
	}
	rep.Checks = append(rep.Checks, eff)
	rep.grade(p.cfg.Profiles)
	rep.DurationMS = time.Since(start).Milliseconds()
	return rep, nil
}

// startChecks runs the start phase of the checks that have one, each
// with the effect read around it.
func (p *prober) startChecks(ctx context.Context) error {
	for _, info := range Checks {
		if info.start == nil {
			continue
		}
		c := &check{p: p}
		if err := info.start(ctx, c); err != nil {
			return err
		}
		if p.effectOn {
			n, err := p.count(ctx)
			if err != nil {
				return err
			}
			c.startDelta = n - p.lastCount
			p.lastCount = n
		}
		p.started[info.ID] = c
	}
	return nil
}

// grade counts the outcomes and grades the core and each profile.
func (rep *Report) grade(required []string) {
	rep.CoreOK = true
	profiles := map[string]*ProfileResult{}
	rep.Profiles = nil
	for _, name := range Profiles {
		rep.Profiles = append(rep.Profiles, ProfileResult{Name: name, Required: slices.Contains(required, name), OK: true})
	}
	for i := range rep.Profiles {
		profiles[rep.Profiles[i].Name] = &rep.Profiles[i]
	}
	rep.OK = true
	for _, r := range rep.Checks {
		switch r.Status {
		case Pass:
			rep.Passed++
		case Fail:
			rep.Failed++
		case Warning:
			rep.Warnings++
		default:
			rep.NA++
		}
		if r.Status != Fail {
			continue
		}
		if r.Grade == Core {
			rep.CoreOK, rep.OK = false, false
			continue
		}
		pr := profiles[r.Profile]
		pr.OK = false
		pr.Failed = append(pr.Failed, r.ID)
		if pr.Required {
			rep.OK = false
		}
	}
}

func executionsText(n int) string {
	if n == 1 {
		return "1 execution"
	}
	return strconv.Itoa(n) + " executions"
}
