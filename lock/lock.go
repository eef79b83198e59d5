package lock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

var (
	// ErrHeld is returned by TryAcquire, and by a Backend's Acquire, when
	// another owner holds the lock; Acquire returns it (together with the
	// context's error) when its context ended while the lock was held.
	ErrHeld = errors.New("lock: held by another owner")
	// ErrNotHeld is returned by Extend and Release when the caller does
	// not hold the lease: another owner, another fence, or a lease that
	// has ended (expired, released, taken over).
	ErrNotHeld = errors.New("lock: not held")
	// ErrLost is a Lease's Err, and the cause of its contexts, once the
	// lease may have ended without Release: the backend refused a renewal,
	// or no renewal was confirmed before the end of the last confirmed
	// lease.
	ErrLost = errors.New("lock: lease lost")
	// ErrMaxHold is a Lease's Err, and the cause of its contexts, once the
	// lease has run out at the end of the maximum hold (Config.MaxHold),
	// after which the watchdog no longer renews it.
	ErrMaxHold = errors.New("lock: maximum hold reached")
	// ErrReleased is a Lease's Err, and the cause of its contexts, after
	// Release.
	ErrReleased = errors.New("lock: lease released")
	// ErrInvalidName is wrapped by the error of an invalid lock name (see
	// ValidateName).
	ErrInvalidName = errors.New("lock: invalid name")
)

// Backend is where locks live: a lease per lock name with an owner token
// and a fencing token. Every operation is atomic in the backend. Times
// are the backend's own (the database's or Redis's clock).
//
// The package's conformance suite, locktest.Run, pins the contract.
type Backend interface {
	// Acquire takes the lock name for owner for ttl, if it is free: never
	// acquired, released, or past the end of its lease. It returns the
	// new fence, greater than every fence the name was given before
	// (across releases and expiries), or ErrHeld. The lease must last at
	// least ttl counted from no earlier than when the call was sent
	// (round up, never down, to the backend's clock resolution).
	Acquire(ctx context.Context, name, owner string, ttl time.Duration) (fence int64, err error)
	// Extend sets the lease of (name, owner, fence) to end ttl from now
	// (on the same terms as Acquire), if it is still held: ErrNotHeld
	// otherwise, also when it ended and nobody took the lock since.
	Extend(ctx context.Context, name, owner string, fence int64, ttl time.Duration) error
	// Release frees the lock if (owner, fence) holds it, keeping the
	// name's fence; ErrNotHeld otherwise.
	Release(ctx context.Context, name, owner string, fence int64) error
}

// Defaults of Config.
const (
	DefaultTTL      = 30 * time.Second
	DefaultMaxHold  = 10 * time.Minute
	DefaultRetryMin = 10 * time.Millisecond
	DefaultRetryMax = time.Second
)

// MaxNameLen is the longest lock name, in bytes.
const MaxNameLen = 255

// Config configures a Locker. A nil Config, and the zero value of each
// field, mean the default.
type Config struct {
	// TTL is the lease a lock is acquired for; the watchdog renews it
	// every third of it, and retries a renewal that failed or timed out
	// (each attempt is bounded by a third) soon after, within what
	// remains of the lease. Default 30 s; at least 3 ms.
	TTL time.Duration
	// MaxHold caps how long a lease is held: the watchdog renews it no
	// further than MaxHold after its acquisition was sent (the last
	// renewal asks for what remains, the time passed counted as the
	// lease's: the larger of the monotonic and the wall clock's), and the
	// lease then ends with ErrMaxHold. Default 10 min; a negative value
	// means no cap; at least TTL.
	MaxHold time.Duration
	// RetryMin and RetryMax bound the wait between two attempts of
	// Acquire while the lock is held: the wait starts at RetryMin, doubles
	// with each attempt up to RetryMax, and is jittered (a random
	// duration between half of it and all of it). Defaults 10 ms and 1 s.
	RetryMin, RetryMax time.Duration
	// Logger receives the watchdog's warnings (a renewal refused or
	// failed, a lease lost). Nil discards them. A line identifies its
	// lock by idem.key_hash (idem.HashKey("lock", name)), never by name.
	Logger *slog.Logger
	// Observer, if set, is told of each attempt to acquire a lock
	// (idem.KindLock, Op idem.OpAcquire, Start and End: Outcome acquired,
	// contended, or error), each Release (Op idem.OpRelease: released, or
	// error), and each lease that ends without Release (an End alone, Op
	// idem.OpExtend, Outcome lost, Err ErrLost or ErrMaxHold). KeyHash is
	// idem.HashKey("lock", name). Nil: nothing is reported.
	Observer idem.Observer
	// Route, if set, names a lock in what Observer is told (Event.Route):
	// it must map the names to a bounded set, fit for a metric's label
	// ("invoice" for "invoice/1234"). Nil: Route is empty.
	Route func(name string) string
}

// An Acquirer hands out Leases: *Locker is one. Accept an Acquirer where
// code takes a lock and its tests need a fake (one that grants every
// call, or hands out leases of its own); use a Locker everywhere else.
type Acquirer interface {
	// TryAcquire makes one attempt at the lock name: a Lease, or an
	// error matching ErrHeld when another owner holds it.
	TryAcquire(ctx context.Context, name string) (Lease, error)
	// Acquire waits for the lock name until it gets it or ctx ends.
	Acquire(ctx context.Context, name string) (Lease, error)
}

var _ Acquirer = (*Locker)(nil)

// Locker acquires leases on a Backend and renews them while they are
// held. It is safe for concurrent use.
type Locker struct {
	b   Backend
	cfg Config
}

// New returns a Locker over b. A nil cfg means defaults; cfg is copied.
func New(b Backend, cfg *Config) (*Locker, error) {
	if b == nil {
		return nil, errors.New("lock: New needs a backend")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TTL < 0 || c.RetryMin < 0 || c.RetryMax < 0 {
		return nil, fmt.Errorf("lock: negative duration in Config (TTL %v, RetryMin %v, RetryMax %v)", c.TTL, c.RetryMin, c.RetryMax)
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.TTL < 3*time.Millisecond {
		return nil, fmt.Errorf("lock: TTL %v is shorter than 3ms", c.TTL)
	}
	if c.MaxHold == 0 {
		c.MaxHold = max(DefaultMaxHold, c.TTL)
	}
	if c.MaxHold > 0 && c.MaxHold < c.TTL {
		return nil, fmt.Errorf("lock: MaxHold %v is shorter than TTL %v", c.MaxHold, c.TTL)
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = max(DefaultRetryMax, c.RetryMin)
	}
	if c.RetryMax < c.RetryMin {
		return nil, fmt.Errorf("lock: RetryMax %v is shorter than RetryMin %v", c.RetryMax, c.RetryMin)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Locker{b: b, cfg: c}, nil
}

// Config returns the locker's configuration with defaults filled in.
func (l *Locker) Config() Config { return l.cfg }

// ValidateName reports whether name can name a lock: 1 to MaxNameLen
// bytes of valid UTF-8 without control characters. The error wraps
// ErrInvalidName. Names are compared byte for byte: "a", "A" and "a "
// are three locks.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidName, len(name), MaxNameLen)
	}
	for i, r := range name {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(name[i:]); size <= 1 {
				return fmt.Errorf("%w: not valid UTF-8 at byte %d", ErrInvalidName, i)
			}
		}
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character at byte %d", ErrInvalidName, i)
		}
	}
	return nil
}

// NewOwner returns a random owner token: 128 bits, hex.
func NewOwner() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// TryAcquire makes one attempt at the lock name: a running Lease, or
// ErrHeld when another owner holds it. The attempt is bounded by ctx and
// by the TTL (an answer later than that would bring a lease already
// over).
func (l *Locker) TryAcquire(ctx context.Context, name string) (Lease, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	lease, err := l.attempt(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("lock: %q: %w", name, err)
	}
	return lease, nil
}

// Acquire acquires the lock name, waiting while another owner holds it:
// it retries with exponential backoff and jitter (Config.RetryMin,
// RetryMax) until it gets the lock or ctx ends; then the error matches
// both ErrHeld and ctx's error. An error of the backend other than
// ErrHeld is returned at once, except an attempt that ran out of its own
// bound (the TTL), which is retried.
func (l *Locker) Acquire(ctx context.Context, name string) (Lease, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	wait := l.cfg.RetryMin
	var timer *time.Timer
	for {
		lease, err := l.attempt(ctx, name)
		switch {
		case err == nil:
			return lease, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("lock: %q: %w (%w)", name, ErrHeld, context.Cause(ctx))
		case errors.Is(err, ErrHeld), errors.Is(err, errAttemptTimeout):
		default:
			return nil, fmt.Errorf("lock: %q: %w", name, err)
		}
		// Equal jitter: between half the wait and all of it.
		d := wait/2 + rand.N(wait/2+1)
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock: %q: %w (%w)", name, ErrHeld, context.Cause(ctx))
		case <-timer.C:
		}
		wait = min(2*wait, l.cfg.RetryMax)
	}
}

// event returns the Event of op on the lock name, for the Observer.
func (l *Locker) event(op, name string) idem.Event {
	e := idem.Event{Kind: idem.KindLock, Op: op, KeyHash: idem.HashKey("lock", name)}
	if l.cfg.Route != nil {
		e.Route = l.cfg.Route(name)
	}
	return e
}

// errAttemptTimeout is the cause of an attempt's context when the TTL
// ran out before the backend answered.
var errAttemptTimeout = errors.New("lock: no answer within the TTL")

// attempt makes one Acquire on the backend and starts the lease's
// watchdog.
func (l *Locker) attempt(ctx context.Context, name string) (*heldLease, error) {
	owner := NewOwner()
	ttl := l.cfg.TTL
	sent := time.Now() // the backend counts the lease from no earlier than this
	obs := l.cfg.Observer
	var e idem.Event
	if obs != nil {
		e = l.event(idem.OpAcquire, name)
		if c := obs.Start(ctx, e); c != nil {
			ctx = c
		}
	}
	actx, cancel := context.WithDeadlineCause(ctx, sent.Add(ttl), errAttemptTimeout)
	fence, err := l.b.Acquire(actx, name, owner, ttl)
	cancel()
	if obs != nil {
		e.Duration, e.Err, e.Outcome = time.Since(sent), err, idem.OutcomeAcquired
		switch {
		case errors.Is(err, ErrHeld):
			e.Outcome, e.Err = idem.OutcomeContended, nil
		case err != nil:
			e.Outcome = idem.OutcomeError
		case !time.Now().Before(sent.Add(ttl)):
			e.Outcome, e.Err = idem.OutcomeError, errAttemptTimeout
		}
		obs.End(ctx, e)
	}
	if err != nil {
		if ctx.Err() == nil && errors.Is(context.Cause(actx), errAttemptTimeout) {
			return nil, fmt.Errorf("%w: %w", errAttemptTimeout, err)
		}
		return nil, err
	}
	if !time.Now().Before(sent.Add(ttl)) {
		// The answer came after the lease it brought had ended: give it
		// back (best effort) and report the attempt as timed out.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
		_ = l.b.Release(rctx, name, owner, fence)
		rcancel()
		return nil, errAttemptTimeout
	}
	return l.start(name, owner, fence, sent), nil
}
