package idemclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// Defaults of the Transport's zero fields.
const (
	DefaultMaxAttempts     = 5
	DefaultBaseDelay       = 100 * time.Millisecond
	DefaultMaxDelay        = 5 * time.Second
	DefaultMaxRetryAfter   = 30 * time.Second
	DefaultMaxBufferedBody = 1 << 20
)

// DefaultMethods are the methods a Transport covers when Methods is nil:
// those the idemhttp middleware covers by default.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// Bounds of the reads of intermediate responses.
const (
	// maxProblem is the most of a 409 body read to find its code.
	maxProblem = 64 << 10
	// maxDrain is the most of an intermediate response read before it is
	// closed, so that its connection can be reused.
	maxDrain = 256 << 10
)

// Transport is an http.RoundTripper that retries requests safely: a
// covered request (Methods) carries an idempotency key, the same on every
// attempt, so a server that honours the key runs it once however many
// attempts reach it. The zero Transport is ready to use; it is safe for
// concurrent use, and its fields must not change once it is in use.
type Transport struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper

	// Methods are the covered methods: a request with one of them gets a
	// key (unless it has one) and is retried. Nil means DefaultMethods
	// (POST and PATCH); an empty non-nil slice covers none. Methods are
	// case-sensitive, as in HTTP.
	//
	// PUT and DELETE are idempotent by HTTP's definition, so they need no
	// key, and the idemhttp middleware does not cover them by default: add
	// them here for a server that guards them with keys, or to
	// RetryMethods to retry them without one.
	Methods []string

	// RetryMethods are methods retried without adding a key, on the word
	// of the server that they are idempotent (GET, HEAD, PUT, DELETE, …):
	// a retried DELETE whose first attempt took effect may answer 404. A
	// request whose method is neither covered nor here is sent once,
	// untouched, and its answer returned as it is.
	RetryMethods []string

	// Header is the request header that carries the key. Empty means
	// Idempotency-Key.
	Header string

	// NewKey returns the key of a covered request that has none (no key
	// header, or one whose values are all empty or blank). Nil means
	// 128 random bits from crypto/rand, as 26 base32 characters (rand.Text).
	// A key that idem.ValidateKey refuses fails the request.
	NewKey func() string

	// MaxAttempts bounds the attempts of one request, the first included.
	// 0 means DefaultMaxAttempts (5); 1 never retries.
	MaxAttempts int

	// BaseDelay and MaxDelay shape the waits between attempts (an
	// answer's longer Retry-After wins): after attempt n the transport waits a
	// random time from 0 to min(MaxDelay, BaseDelay·2ⁿ⁻¹) ("full jitter",
	// so that clients that failed together do not retry together). 0 means
	// DefaultBaseDelay (100 ms) and DefaultMaxDelay (5 s).
	BaseDelay, MaxDelay time.Duration

	// MaxRetryAfter is the longest Retry-After the transport waits for;
	// an answer that asks for a longer wait is returned to the caller. 0
	// means DefaultMaxRetryAfter (30 s).
	MaxRetryAfter time.Duration

	// MaxBufferedBody bounds the body of a request without GetBody that the
	// transport reads into memory so it can send it again. A larger body
	// is sent once, as it comes, and its request is not retried. 0 means
	// DefaultMaxBufferedBody (1 MiB); a negative value never buffers, so
	// only requests with GetBody (or without a body) are retried.
	// http.NewRequest sets GetBody for bytes.Buffer, bytes.Reader and
	// strings.Reader bodies.
	MaxBufferedBody int64

	// OnRetry, if set, is called before each wait for another attempt
	// (for logs and metrics). It must not keep the Retry's Request.
	OnRetry func(Retry)
}

// Retry describes an attempt that is about to be retried.
type Retry struct {
	// Request is the attempt's request, with its key.
	Request *http.Request
	// Attempt is the number of the attempt that failed, from 1.
	Attempt int
	// StatusCode is its answer's status, 0 when it failed with Err.
	StatusCode int
	// Err is the error of an attempt that got no answer.
	Err error
	// Wait is how long the transport waits before the next attempt.
	Wait time.Duration
}

// settings are a Transport's fields with the defaults filled in.
type settings struct {
	base          http.RoundTripper
	methods       []string
	retryMethods  []string
	header        string
	newKey        func() string
	maxAttempts   int
	baseDelay     time.Duration
	maxDelay      time.Duration
	maxRetryAfter time.Duration
	maxBuffered   int64
	onRetry       func(Retry)
}

func (t *Transport) settings() (settings, error) {
	s := settings{
		base:          t.Base,
		methods:       t.Methods,
		retryMethods:  t.RetryMethods,
		header:        t.Header,
		newKey:        t.NewKey,
		maxAttempts:   t.MaxAttempts,
		baseDelay:     t.BaseDelay,
		maxDelay:      t.MaxDelay,
		maxRetryAfter: t.MaxRetryAfter,
		maxBuffered:   t.MaxBufferedBody,
		onRetry:       t.OnRetry,
	}
	if s.base == nil {
		s.base = http.DefaultTransport
	}
	if s.methods == nil {
		s.methods = DefaultMethods
	}
	if s.header == "" {
		s.header = idemhttp.HeaderIdempotencyKey
	} else if !isToken(s.header) {
		return s, fmt.Errorf("idemclient: Header %q is not a header name", s.header)
	}
	if s.newKey == nil {
		s.newKey = rand.Text
	}
	switch {
	case s.maxAttempts < 0:
		return s, fmt.Errorf("idemclient: MaxAttempts must not be negative, got %d", s.maxAttempts)
	case s.baseDelay < 0, s.maxDelay < 0, s.maxRetryAfter < 0:
		return s, fmt.Errorf("idemclient: BaseDelay, MaxDelay and MaxRetryAfter must not be negative, got %v, %v and %v",
			s.baseDelay, s.maxDelay, s.maxRetryAfter)
	}
	if s.maxAttempts == 0 {
		s.maxAttempts = DefaultMaxAttempts
	}
	if s.baseDelay == 0 {
		s.baseDelay = DefaultBaseDelay
	}
	if s.maxDelay == 0 {
		s.maxDelay = DefaultMaxDelay
	}
	if s.maxRetryAfter == 0 {
		s.maxRetryAfter = DefaultMaxRetryAfter
	}
	if s.maxBuffered == 0 {
		s.maxBuffered = DefaultMaxBufferedBody
	}
	return s, nil
}

// RoundTrip sends req, and sends it again while the answer says that
// another attempt may succeed, up to MaxAttempts attempts:
//
//   - an error from Base: a refused or reset connection, a connection
//     closed before the answer arrived (the server may well have run the
//     request: only the key makes the retry safe). Not retried: the
//     request's context ended, and TLS certificate errors;
//   - 409 with the problem code PROCESSING (the request with the key is
//     still running on the server): the other 409s (a business conflict)
//     are the server's final answer;
//   - 429, 502, 503 and 504;
//   - but never an answer marked Idempotent-Replayed: true, which is the
//     key's stored answer and will not change.
//
// Between attempts it waits a backoff with full jitter, or the answer's
// Retry-After (seconds or an HTTP date) when that is longer. It gives up, and returns
// the last answer (or error) as it is, when the attempts are used up, when
// the wait would end after the context's deadline, or when Retry-After
// asks for more than MaxRetryAfter; it returns the context's error when
// the context ends during a wait. The bodies of the answers it retries
// are drained and closed.
//
// req is not modified: each attempt is a clone, and the returned
// response's Request (set by Base) shows the key the attempts carried. A
// covered request that has the key header keeps it, whatever the case of
// the name it is kept under in the header map.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	s, err := t.settings()
	if err != nil {
		closeBody(req)
		return nil, err
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	covered := slices.Contains(s.methods, method)
	if !covered && !slices.Contains(s.retryMethods, method) {
		return s.base.RoundTrip(req)
	}

	ctx := req.Context()
	r := req.Clone(ctx)
	if r.Header == nil {
		// A request made without one (http.Client adds it, a direct
		// RoundTrip does not): the key needs a map to go in.
		r.Header = make(http.Header)
	}
	if covered {
		keys, blank := keyValues(r.Header, s.header)
		switch {
		case len(keys) == 0:
			key := s.newKey()
			if err := idem.ValidateKey(key); err != nil {
				closeBody(req)
				return nil, fmt.Errorf("idemclient: NewKey: %w", err)
			}
			deleteFields(r.Header, s.header) // an empty field, under any spelling
			r.Header.Set(s.header, key)
		case blank:
			// The key goes alone: beside an empty value the server reads
			// two values, and refuses the request.
			deleteFields(r.Header, s.header)
			r.Header[http.CanonicalHeaderKey(s.header)] = keys
		}
	}

	maxAttempts := s.maxAttempts
	if r.Body != nil && r.Body != http.NoBody && r.GetBody == nil {
		if s.maxBuffered < 0 {
			return s.base.RoundTrip(r)
		}
		buf, err := io.ReadAll(io.LimitReader(r.Body, s.maxBuffered+1))
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("idemclient: reading the request body: %w", err)
		}
		if int64(len(buf)) > s.maxBuffered {
			// Too large to keep: send it once, what was read and the rest.
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
			return s.base.RoundTrip(r)
		}
		closeBody(req)
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
		r.Body, _ = r.GetBody()
	}
	if r.Body == nil || r.Body == http.NoBody {
		r.GetBody = nil // nothing to rewind
	}

	for attempt := 1; ; attempt++ {
		resp, err := s.base.RoundTrip(r)
		if attempt == maxAttempts || ctx.Err() != nil {
			return resp, err
		}
		var retryAfter time.Duration
		var hasRetryAfter bool
		if err != nil {
			if !retryableError(err) {
				return nil, err
			}
		} else {
			if !retryableResponse(resp) {
				return resp, nil
			}
			retryAfter, hasRetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
			if hasRetryAfter && retryAfter > s.maxRetryAfter {
				return resp, nil
			}
		}
		// Retry-After is a minimum: a server that answers "0" (or a past
		// date) again and again still gets the backoff's spacing, and
		// the attempts are not spent in a burst.
		wait := backoff(s.baseDelay, s.maxDelay, attempt)
		if hasRetryAfter {
			wait = max(wait, retryAfter)
		}
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Add(wait).Before(deadline) {
			return resp, err
		}
		next := r.Clone(ctx)
		if r.GetBody != nil {
			body, gerr := r.GetBody()
			if gerr != nil {
				return resp, err
			}
			next.Body = body
		}
		if s.onRetry != nil {
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			s.onRetry(Retry{Request: r, Attempt: attempt, StatusCode: status, Err: err, Wait: wait})
		}
		if resp != nil {
			discard(resp)
		}
		if err := sleep(ctx, wait); err != nil {
			closeBody(next)
			return nil, err
		}
		r = next
	}
}

// CloseIdleConnections closes the idle connections of Base, if it has
// that method (http.Client.CloseIdleConnections calls this one).
func (t *Transport) CloseIdleConnections() {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if c, ok := base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// retryableError reports whether an attempt that failed with err may be
// sent again: any error but a certificate the client refuses, which
// another attempt would refuse too. (An ended context is checked before.)
func retryableError(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		header    tls.RecordHeaderError
	)
	return !errors.As(err, &verify) && !errors.As(err, &authority) && !errors.As(err, &hostname) &&
		!errors.As(err, &invalid) && !errors.As(err, &header)
}

// retryableResponse reports whether resp asks for another attempt. For a
// 409 it reads the problem's code, and puts back what it read.
func retryableResponse(resp *http.Response) bool {
	if resp.Header.Get(idemhttp.HeaderReplayed) == "true" {
		return false
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		return problemCode(resp) == idemhttp.CodeProcessing
	}
	return false
}

// problemCode returns the "code" member of a JSON (problem) body, or "".
// The body stays readable from its start.
func problemCode(resp *http.Response) string {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" && mt != "application/json" || resp.Body == nil {
		return ""
	}
	peek, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblem))
	body := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(peek), body), body}
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(peek, &p) != nil {
		return ""
	}
	return p.Code
}

// parseRetryAfter returns the wait a Retry-After value asks for: a number
// of seconds, or an HTTP date (a date in the past asks for none).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		// ParseUint reports a range error as soon as the digits overflow,
		// before it sees a byte that is no digit: "99999999999999999999x"
		// is refused here, not taken for the longest wait.
		if strings.Trim(v, "0123456789") != "" {
			return 0, false
		}
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return time.Duration(1<<63 - 1), true
			}
			return 0, false
		}
		if secs > uint64((1<<63-1)/time.Second) {
			return time.Duration(1<<63 - 1), true
		}
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

// backoff returns a random wait from 0 to min(maxDelay, base·2ⁿ⁻¹).
func backoff(base, maxDelay time.Duration, attempt int) time.Duration {
	d := maxDelay
	if shift := attempt - 1; shift < 62 && base <= maxDelay>>shift {
		d = base << shift
	}
	return time.Duration(mrand.Int64N(int64(d) + 1))
}

// sleep waits d, or until ctx ends (its cause is the error).
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// discard drains (up to a bound) and closes an answer that is not
// returned, so that its connection can carry the next attempt.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	resp.Body.Close()
}

// closeBody closes a request's body, as a RoundTripper must even when it
// fails.
func closeBody(r *http.Request) {
	if r.Body != nil {
		r.Body.Close()
	}
}

// keyValues returns the values of h's fields named name that are not
// empty nor blank, whatever the case of the name they are kept under: a
// caller that sets h["idempotency-key"] directly bypasses
// canonicalisation, net/http sends the field as it is, and the server
// folds its name's case, so it is the key header all the same. blank
// reports whether such a field has an empty or blank value (spaces and
// tabs, which a server trims) too. Such a value carries no key: sent as
// it is alone, a server that reads it as absent would run every attempt
// unguarded, and one that refuses it would refuse the request; sent
// beside the key, the server reads two keys and refuses the request.
func keyValues(h http.Header, name string) (keys []string, blank bool) {
	for k, values := range h {
		if !strings.EqualFold(k, name) {
			continue
		}
		for _, v := range values {
			if strings.Trim(v, " \t") == "" {
				blank = true
				continue
			}
			keys = append(keys, v)
		}
	}
	return keys, blank
}

// deleteFields deletes the fields named name from h, whatever the case of
// the name they are kept under.
func deleteFields(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

// isToken reports whether s is an HTTP token (RFC 9110), as a header name
// must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
