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
}

// Error reports the time of the first use.
func (e *UsedError) Error() string {
	return "token: already used at " + e.UsedAt.UTC().Format(time.RFC3339Nano)
}

// Is reports whether target is ErrUsed.
func (e *UsedError) Is(target error) bool { return target == ErrUsed }

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
	// TTL is how long a token lives after Issue, by the store's clock,
	// whether it is used or not: a used token answers ErrUsed (with its
	// result) until then, ErrInvalid after. Between MinTTL (1 s) and
	// MaxTTL (24 h). Default DefaultTTL (30 min).
	TTL time.Duration
	// Rand is the source of the IDs' 16 random bytes. Default
	// crypto/rand.Reader. Anything but a cryptographic source makes IDs
	// guessable.
	Rand io.Reader
	// Observer, if set, is told of each Issue (idem.KindToken, Op
	// idem.OpIssue, Start and End: Outcome issued, or error) and each
	// Consume and ConsumeTx (Op idem.OpConsume: consumed, used, invalid,
	// or error). KeyHash is idem.HashKey(scope, the token's digest): it
	// names neither the scope nor the token. Nil: nothing is reported.
	Observer idem.Observer
}

// Tokens issues and consumes tokens held by a Store. It is safe for
// concurrent use if its Config.Rand is (crypto/rand's is).
type Tokens struct {
	store Store
	ttl   time.Duration
	rand  io.Reader
	obs   idem.Observer
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
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return &Tokens{store: s, ttl: c.TTL, rand: c.Rand, obs: c.Observer}, nil
}

// TTL returns the time a token lives.
func (t *Tokens) TTL() time.Duration { return t.ttl }

// Issue makes a new token for scope, stores it, and returns it. The store
// keeps only its Digest.
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
	return Token{ID: id, Scope: scope, ExpiresAt: exp}, nil
}

// Consume spends the token id issued to scope and attaches result (at most
// MaxResultLen bytes; nil for none) to it, atomically: of any number of
// concurrent calls on one token, one returns nil and the others a
// *UsedError carrying the result of the one that returned nil. It returns
//
//   - nil: this call is the token's first use;
//   - a *UsedError (errors.Is(err, ErrUsed)): the token was spent before;
//     UsedError.Result is what that use attached, so a repeated submission
//     can be led to what the first one made;
//   - ErrInvalid: no live token id is issued to scope (unknown, expired,
//     another scope's, or not a token at all: a malformed id is refused
//     without a call to the store);
//   - ErrScope, ErrResultTooLarge: a mistake of the caller;
//   - another error: the store failed, and the token may or may not have
//     been spent (a retry with the same result answers nil or a
//     *UsedError with that result).
func (t *Tokens) Consume(ctx context.Context, scope, id string, result []byte) error {
	d, err := check(scope, id, result)
	if err != nil && !errors.Is(err, ErrInvalid) {
		return err
	}
	if t.obs == nil {
		if err != nil {
			return err
		}
		return wrapStore("consume", t.store.Consume(ctx, scope, d, result))
	}
	e, start := t.consumeEvent(scope, d), time.Now()
	if c := t.obs.Start(ctx, e); c != nil {
		ctx = c
	}
	if err == nil {
		err = wrapStore("consume", t.store.Consume(ctx, scope, d, result))
	}
	t.end(ctx, e, start, err, idem.OutcomeConsumed)
	return err
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
	case errors.Is(err, ErrInvalid):
		e.Outcome = idem.OutcomeInvalid
	default:
		e.Outcome, e.Err = idem.OutcomeError, err
	}
	t.obs.End(ctx, e)
}

// ConsumeTx is Consume inside the caller's SQL transaction tx, for a Store
// that implements TxStore (the sqlstore package's): the token is spent if
// and only if tx commits, together with the effect it guards (the order
// the submission creates). Until tx ends, a concurrent Consume of the same
// token waits for it, and then answers ErrUsed with tx's result if tx
// committed, or spends the token itself if tx rolled back. A Store without
// TxStore gives ErrTxUnsupported.
func (t *Tokens) ConsumeTx(ctx context.Context, tx *sql.Tx, scope, id string, result []byte) error {
	ts, ok := t.store.(TxStore)
	if !ok {
		return ErrTxUnsupported
	}
	if tx == nil {
		return errors.New("token: ConsumeTx: nil *sql.Tx")
	}
	d, err := check(scope, id, result)
	if err != nil && !errors.Is(err, ErrInvalid) {
		return err
	}
	if t.obs == nil {
		if err != nil {
			return err
		}
		return wrapStore("consume in tx", ts.ConsumeTx(ctx, tx, scope, d, result))
	}
	e, start := t.consumeEvent(scope, d), time.Now()
	if c := t.obs.Start(ctx, e); c != nil {
		ctx = c
	}
	if err == nil {
		err = wrapStore("consume in tx", ts.ConsumeTx(ctx, tx, scope, d, result))
	}
	t.end(ctx, e, start, err, idem.OutcomeConsumed)
	return err
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
// of the contract (nil, *UsedError, ErrInvalid) as they are.
func wrapStore(op string, err error) error {
	if err == nil || errors.Is(err, ErrInvalid) || errors.Is(err, ErrUsed) {
		return err
	}
	return fmt.Errorf("token: %s: %w", op, err)
}
