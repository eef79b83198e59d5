package token

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

// Limits and defaults.
const (
	// IDLen is the length of a token's ID: 16 random bytes in unpadded
	// base64url (RFC 4648 §5).
	IDLen = 22
	// DigestLen is the length of a token's Digest: SHA-256 in lowercase hex.
	DigestLen = 64
	// MaxScopeLen is the longest scope, in bytes. A scope is never empty.
	MaxScopeLen = 255
	// MaxResultLen is the longest result a Consume may attach to a token,
	// in bytes: a reference to what the first use made (an order's ID, a
	// URL, a small JSON document), not a response body.
	MaxResultLen = 16 << 10
	// DefaultTTL is how long a token lives when Config.TTL is zero.
	DefaultTTL = 30 * time.Minute
	// MinTTL and MaxTTL bound Config.TTL.
	MinTTL = time.Second
	MaxTTL = 24 * time.Hour
	// DefaultSweepLimit is the number of tokens Sweep removes when given a
	// limit <= 0.
	DefaultSweepLimit = 1000
	// DefaultKeep is how long a used token is kept after its use when
	// Config.Keep is zero: idem's record retention, so a submission
	// repeated within a day is led to what its first use made.
	DefaultKeep = idem.DefaultRetention
	// MinKeep and MaxKeep bound Config.Keep.
	MinKeep = time.Second
	MaxKeep = 30 * 24 * time.Hour
	// DefaultMaxLive is the number of unused tokens a scope keeps when
	// Config.MaxLive is zero: enough for several open tabs.
	DefaultMaxLive = 20
	// FingerprintLen is the length of a Spend's Fingerprint when it has
	// one: SHA-256 in lowercase hex.
	FingerprintLen = 64
)

// ErrInvalid is the answer to a token that cannot be spent: unknown,
// expired (used or not), malformed, or issued to another scope. A token
// presented under another scope is not spent by it.
var ErrInvalid = errors.New("token: invalid or expired")

// ErrUsed is matched (errors.Is) by the *UsedError of a token that was
// already spent.
var ErrUsed = errors.New("token: already used")

// ErrScope is returned for a scope that is not 1 to MaxScopeLen bytes of
// valid UTF-8 without control characters (the rule of idem's scopes, less
// the empty one): a mistake of the caller, not of the client that presents
// the token. The error wraps it with the reason.
var ErrScope = errors.New("token: invalid scope")

// ErrMismatch is matched (errors.Is) by the *MismatchError of a token
// already spent by a different request. It is deliberately not ErrUsed: a
// caller that leads an ErrUsed to the first use's result must not lead a
// different submission there.
var ErrMismatch = errors.New("token: already used for a different request")

// ErrResultTooLarge is returned by Consume for a result longer than
// MaxResultLen.
var ErrResultTooLarge = errors.New("token: result longer than MaxResultLen")

// ErrDuplicate is returned by Store.Insert when the digest is already
// stored. Random IDs from crypto/rand never meet; Issue returns it only
// when Config.Rand repeats itself.
var ErrDuplicate = errors.New("token: duplicate token")

// ErrTxUnsupported is returned by Tokens.ConsumeTx when the Store does not
// implement TxStore.
var ErrTxUnsupported = errors.New("token: the store cannot consume inside an SQL transaction")

// UsedError is the answer to a token already spent: when, and the result
// the first use attached to it. errors.Is(err, ErrUsed) reports it.
type UsedError struct {
	// UsedAt is when the token was spent, on the store's clock
	// (millisecond precision).
	UsedAt time.Time
	// Result is the result the first use attached, or nil if it attached
	// none (an empty result reads back as nil).
	Result []byte
	// Fingerprint is the Spend.Fingerprint of the first use ("" for
	// none).
	Fingerprint string
}

// Error reports the time of the first use.
func (e *UsedError) Error() string {
	return "token: already used at " + e.UsedAt.UTC().Format(time.RFC3339Nano)
}

// Is reports whether target is ErrUsed.
func (e *UsedError) Is(target error) bool { return target == ErrUsed }

// MismatchError is the answer to a token already spent by a request other
// than the one presented (Use.Request of both uses set, and different).
// It carries no result: the first use's result belongs to another
// submission. errors.Is(err, ErrMismatch) reports it; errors.Is(err,
// ErrUsed) does not.
type MismatchError struct {
	// UsedAt is when the token was spent, on the store's clock.
	UsedAt time.Time
}

// Error reports the time of the first use.
func (e *MismatchError) Error() string {
	return "token: already used at " + e.UsedAt.UTC().Format(time.RFC3339Nano) + " for a different request"
}

// Is reports whether target is ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// Use is what a Consume presents and attaches.
type Use struct {
	// Request is the submission the token guards, in a canonical form of
	// the caller's (for a form: its fields sorted; for a JSON body: the
	// request decoded and encoded again canonically). Tokens keeps only
	// its SHA-256, with the use; a later Consume of the spent token with a
	// different Request gets a *MismatchError. Nil: not checked — it
	// matches any first use, and a later Consume of a token spent without
	// Request is not checked either.
	Request []byte
	// Result is what the first use made (an order's number), at most
	// MaxResultLen bytes; nil for none.
	Result []byte
}

// Spend is what Tokens hands a Store's Consume: the Use, digested, and how
// long to keep the used token.
type Spend struct {
	// Fingerprint is the SHA-256 of Use.Request in lowercase hex
	// (FingerprintLen characters), or "" for none. The store keeps it with
	// the use and returns it in UsedError.Fingerprint.
	Fingerprint string
	// Result is what the use attaches, at most MaxResultLen bytes.
	Result []byte
	// Keep is how long the store keeps the token after its use: at the
	// use, the token's expiry becomes the later of its expiry and the
	// store's now + Keep. Zero or less: the expiry stays as it is.
	Keep time.Duration
}

// Token is a pre-issued submit token: hand its ID to the client (in a form
// field, a header), and Consume it when the client submits.
type Token struct {
	// ID is the token: 22 characters of unpadded base64url encoding 128
	// random bits. It is URL-safe and needs no escaping in a form or a
	// header.
	ID string
	// Scope is whom the token was issued to: only a Consume under the same
	// scope can spend it.
	Scope string
	// ExpiresAt is when the token ends, on the store's clock.
	ExpiresAt time.Time
}

// Config configures Tokens. A nil Config, and the zero value of each
// field, mean the default.
type Config struct {
	// TTL is how long an unused token lives after Issue, by the store's
	// clock: it answers ErrInvalid after. Between MinTTL (1 s) and MaxTTL
	// (24 h). Default DefaultTTL (30 min).
	TTL time.Duration
	// Keep is how long a used token is remembered after its use, by the
	// store's clock: it answers a *UsedError (with its result) until the
	// later of its TTL's end and its use + Keep, ErrInvalid after. Between
	// MinKeep (1 s) and MaxKeep (30 days). Default DefaultKeep (24 h).
	Keep time.Duration
	// MaxLive bounds the unused tokens of one scope: after each Issue, the
	// scope's unused tokens beyond its MaxLive newest are removed (they
	// answer ErrInvalid), so a client that asks for tokens in a loop fills
	// no table. Used tokens are never removed for it, nor counted. Zero
	// means DefaultMaxLive (20: several open tabs); negative means no cap.
	MaxLive int
	// Rand is the source of the IDs' 16 random bytes. Default
	// crypto/rand.Reader. Anything but a cryptographic source makes IDs
	// guessable.
	Rand io.Reader
	// Observer, if set, is told of each Issue (idem.KindToken, Op
	// idem.OpIssue, Start and End: Outcome issued, or error) and each
	// Consume and ConsumeTx (Op idem.OpConsume: consumed, used, invalid,
	// mismatch or error), and of the trim that follows each Issue (Op
	// idem.OpTrim, N the tokens removed: Outcome ok, or error). KeyHash is
	// idem.HashKey(scope, the token's digest) (for a trim, of the issued
	// token): it names neither the scope nor the token. Nil: nothing is
	// reported.
	Observer idem.Observer
}

// Tokens issues and consumes tokens held by a Store. It is safe for
// concurrent use if its Config.Rand is (crypto/rand's is).
type Tokens struct {
	store   Store
	ttl     time.Duration
	keep    time.Duration
	maxLive int // < 0: no cap
	rand    io.Reader
	obs     idem.Observer
}

// New returns Tokens over s. A nil cfg means defaults; cfg is copied.
func New(s Store, cfg *Config) (*Tokens, error) {
	if s == nil {
		return nil, errors.New("token: New needs a Store")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.TTL == 0:
		c.TTL = DefaultTTL
	case c.TTL < MinTTL || c.TTL > MaxTTL:
		return nil, fmt.Errorf("token: TTL %v out of bounds [%v, %v]", c.TTL, MinTTL, MaxTTL)
	}
	switch {
	case c.Keep == 0:
		c.Keep = DefaultKeep
	case c.Keep < MinKeep || c.Keep > MaxKeep:
		return nil, fmt.Errorf("token: Keep %v out of bounds [%v, %v]", c.Keep, MinKeep, MaxKeep)
	}
	if c.MaxLive == 0 {
		c.MaxLive = DefaultMaxLive
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return &Tokens{store: s, ttl: c.TTL, keep: c.Keep, maxLive: c.MaxLive, rand: c.Rand, obs: c.Observer}, nil
}

// TTL returns the time an unused token lives.
func (t *Tokens) TTL() time.Duration { return t.ttl }

// Keep returns the time a used token is kept after its use.
func (t *Tokens) Keep() time.Duration { return t.keep }

// Issue makes a new token for scope, stores it, and returns it. The store
// keeps only its Digest. Then, unless Config.MaxLive is negative, it trims
// the scope's unused tokens to the MaxLive newest (Store.Trim).
func (t *Tokens) Issue(ctx context.Context, scope string) (Token, error) {
	if err := checkScope(scope); err != nil {
		return Token{}, err
	}
	var b [16]byte
	if _, err := io.ReadFull(t.rand, b[:]); err != nil {
		return Token{}, fmt.Errorf("token: issue: random bytes: %w", err)
	}
	id := base64.RawURLEncoding.EncodeToString(b[:])
	d := digest(id)
	var exp time.Time
	var err error
	if t.obs == nil {
		exp, err = t.store.Insert(ctx, scope, d, t.ttl)
	} else {
		e, start := idem.Event{Kind: idem.KindToken, Op: idem.OpIssue, KeyHash: idem.HashKey(scope, d)}, time.Now()
		if c := t.obs.Start(ctx, e); c != nil {
			ctx = c
		}
		exp, err = t.store.Insert(ctx, scope, d, t.ttl)
		t.end(ctx, e, start, err, idem.OutcomeIssued)
	}
	if err != nil {
		return Token{}, fmt.Errorf("token: issue: %w", err)
	}
	if t.maxLive >= 0 {
		// The token is stored and good: a failed trim does not fail the
		// issue, which would leave the caller without the token it got
		// and fail a page for housekeeping. The failure goes to the
		// Observer; the next Issue of the scope trims again, so the bound
		// holds again as soon as the store answers.
		t.trim(ctx, scope, d)
	}
	return Token{ID: id, Scope: scope, ExpiresAt: exp}, nil
}

// trim runs Store.Trim after an Issue of digest d under scope.
func (t *Tokens) trim(ctx context.Context, scope, d string) {
	if t.obs == nil {
		_, _ = t.store.Trim(ctx, scope, t.maxLive)
		return
	}
	e, start := idem.Event{Kind: idem.KindToken, Op: idem.OpTrim, KeyHash: idem.HashKey(scope, d)}, time.Now()
	if c := t.obs.Start(ctx, e); c != nil {
		ctx = c
	}
	n, err := t.store.Trim(ctx, scope, t.maxLive)
	e.N = int64(n)
	if err != nil {
		err = fmt.Errorf("token: trim: %w", err)
	}
	t.end(ctx, e, start, err, idem.OutcomeOK)
}

// Consume spends the token id issued to scope and attaches u.Result (at
// most MaxResultLen bytes; nil for none) and the SHA-256 of u.Request to
// it, atomically: of any number of concurrent calls on one token, one
// returns nil and the others a *UsedError carrying the result of the one
// that returned nil (or a *MismatchError, for a different Request). It
// returns
//
//   - nil: this call is the token's first use;
//   - a *UsedError (errors.Is(err, ErrUsed)): the token was spent before,
//     by the same Request (or one of the two uses had none);
//     UsedError.Result is what that use attached, so a repeated submission
//     can be led to what the first one made. A used token answers so for
//     at least Config.Keep after its use (24 h by default), whatever its
//     TTL;
//   - a *MismatchError (errors.Is(err, ErrMismatch), not ErrUsed): the
//     token was spent by a different Request; the submission is another
//     one than the first, and must not be led to its result;
//   - ErrInvalid: no live token id is issued to scope (unknown, expired,
//     trimmed, another scope's, or not a token at all: a malformed id is
//     refused without a call to the store);
//   - ErrScope, ErrResultTooLarge: a mistake of the caller;
//   - another error: the store failed, and the token may or may not have
//     been spent (a retry with the same Use answers nil or a *UsedError
//     with that result).
func (t *Tokens) Consume(ctx context.Context, scope, id string, u Use) error {
	return t.consume(ctx, "consume", scope, id, u, t.store.Consume)
}

// ConsumeTx is Consume inside the caller's SQL transaction tx, for a Store
// that implements TxStore (the sqlstore package's): the token is spent if
// and only if tx commits, together with the effect it guards (the order
// the submission creates). Until tx ends, a concurrent Consume of the same
// token waits for it, and then answers ErrUsed with tx's result (or
// ErrMismatch) if tx committed, or spends the token itself if tx rolled
// back. A *MismatchError or a *UsedError leaves tx as it was: roll it
// back. A Store without TxStore gives ErrTxUnsupported.
func (t *Tokens) ConsumeTx(ctx context.Context, tx *sql.Tx, scope, id string, u Use) error {
	ts, ok := t.store.(TxStore)
	if !ok {
		return ErrTxUnsupported
	}
	if tx == nil {
		return errors.New("token: ConsumeTx: nil *sql.Tx")
	}
	return t.consume(ctx, "consume in tx", scope, id, u, func(ctx context.Context, scope, d string, s Spend) error {
		return ts.ConsumeTx(ctx, tx, scope, d, s)
	})
}

// consume is Consume and ConsumeTx: it checks the arguments, runs spend
// (the store's Consume or ConsumeTx), compares a used token's fingerprint
// with u's, and tells the Observer.
func (t *Tokens) consume(ctx context.Context, op, scope, id string, u Use,
	spend func(ctx context.Context, scope, d string, s Spend) error,
) error {
	d, err := check(scope, id, u.Result)
	if err != nil && !errors.Is(err, ErrInvalid) {
		return err
	}
	sp := Spend{Result: u.Result, Keep: t.keep}
	if u.Request != nil {
		sp.Fingerprint = Fingerprint(u.Request)
	}
	run := func(ctx context.Context) error {
		if err := checkFingerprint(sp.Fingerprint); err != nil {
			return err
		}
		return compare(wrapStore(op, spend(ctx, scope, d, sp)), sp.Fingerprint)
	}
	if t.obs == nil {
		if err != nil {
			return err
		}
		return run(ctx)
	}
	e, start := t.consumeEvent(scope, d), time.Now()
	if c := t.obs.Start(ctx, e); c != nil {
		ctx = c
	}
	if err == nil {
		err = run(ctx)
	}
	t.end(ctx, e, start, err, idem.OutcomeConsumed)
	return err
}

// compare turns the *UsedError err of a token spent with another
// fingerprint than fp into a *MismatchError; both must be set.
func compare(err error, fp string) error {
	var ue *UsedError
	if fp == "" || !errors.As(err, &ue) || ue.Fingerprint == "" || ue.Fingerprint == fp {
		return err
	}
	return &MismatchError{UsedAt: ue.UsedAt}
}

// Fingerprint returns the Spend.Fingerprint of a Use.Request: its SHA-256
// in lowercase hex.
func Fingerprint(request []byte) string {
	sum := sha256.Sum256(request)
	return hex.EncodeToString(sum[:])
}

// checkFingerprint reports whether fp is "" or FingerprintLen lowercase
// hex characters.
func checkFingerprint(fp string) error {
	if fp == "" {
		return nil
	}
	if len(fp) != FingerprintLen {
		return fmt.Errorf("token: fingerprint of %d characters, want %d", len(fp), FingerprintLen)
	}
	for i := 0; i < len(fp); i++ {
		if c := fp[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("token: fingerprint has %q at %d, want lowercase hex", c, i)
		}
	}
	return nil
}

// consumeEvent is the Event of a Consume of digest d ("" for a malformed
// token: no KeyHash).
func (t *Tokens) consumeEvent(scope, d string) idem.Event {
	e := idem.Event{Kind: idem.KindToken, Op: idem.OpConsume}
	if d != "" {
		e.KeyHash = idem.HashKey(scope, d)
	}
	return e
}

// end reports the end of the operation e, begun at start, that returned
// err (ok: its Outcome when err is nil).
func (t *Tokens) end(ctx context.Context, e idem.Event, start time.Time, err error, ok string) {
	e.Duration = time.Since(start)
	switch {
	case err == nil:
		e.Outcome = ok
	case errors.Is(err, ErrUsed):
		e.Outcome = idem.OutcomeUsed
	case errors.Is(err, ErrMismatch):
		e.Outcome = idem.OutcomeMismatch
	case errors.Is(err, ErrInvalid):
		e.Outcome = idem.OutcomeInvalid
	default:
		e.Outcome, e.Err = idem.OutcomeError, err
	}
	t.obs.End(ctx, e)
}

// Sweep removes up to limit expired tokens from the store (a limit <= 0
// means DefaultSweepLimit) and returns how many it removed. Stores whose
// entries expire by themselves (Redis) remove none.
func (t *Tokens) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = DefaultSweepLimit
	}
	n, err := t.store.Sweep(ctx, limit)
	return n, wrapStore("sweep", err)
}

// Digest returns what a Store keeps of the token id: the SHA-256 of the
// ID, in lowercase hex (DigestLen characters). It returns ErrInvalid if id
// is not the form Issue makes. A reader of the store's data sees digests
// only, and cannot present a token it read there.
func Digest(id string) (string, error) {
	if !ValidID(id) {
		return "", ErrInvalid
	}
	return digest(id), nil
}

// ValidID reports whether id has the form of a token's ID: IDLen
// characters of unpadded base64url in its canonical spelling (the unused
// low bits of the last character are zero).
func ValidID(id string) bool {
	if len(id) != IDLen {
		return false
	}
	var b [16]byte
	n, err := base64.RawURLEncoding.Strict().Decode(b[:], []byte(id))
	return err == nil && n == len(b)
}

func digest(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// check validates Consume's arguments and returns the token's digest.
func check(scope, id string, result []byte) (string, error) {
	if err := checkScope(scope); err != nil {
		return "", err
	}
	if len(result) > MaxResultLen {
		return "", fmt.Errorf("%w: %d bytes", ErrResultTooLarge, len(result))
	}
	return Digest(id)
}

func checkScope(scope string) error {
	switch {
	case scope == "":
		return fmt.Errorf("%w: empty", ErrScope)
	case len(scope) > MaxScopeLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrScope, len(scope), MaxScopeLen)
	case !utf8.ValidString(scope):
		return fmt.Errorf("%w: not valid UTF-8", ErrScope)
	}
	for i, r := range scope {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: a control character at byte %d", ErrScope, i)
		}
	}
	return nil
}

// wrapStore names the operation in a store's error, leaving the answers
// of the contract (nil, *UsedError, *MismatchError, ErrInvalid) as they
// are.
func wrapStore(op string, err error) error {
	if err == nil || errors.Is(err, ErrInvalid) || errors.Is(err, ErrUsed) || errors.Is(err, ErrMismatch) {
		return err
	}
	return fmt.Errorf("token: %s: %w", op, err)
}
