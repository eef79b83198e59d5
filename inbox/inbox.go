package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/retry"
)

// Limits and defaults.
const (
	// MaxIDLen is the longest message ID and consumer group, in bytes.
	MaxIDLen = 255
	// MaxReasonLen is the longest failure reason a record keeps, in
	// bytes; a longer one is cut at a character boundary.
	MaxReasonLen = 1024
	// DefaultMaxAttempts is Config.MaxAttempts' default.
	DefaultMaxAttempts = 5
	// DefaultLease is Config.Lease's default.
	DefaultLease = 30 * time.Second
	// DefaultSweepLimit is the number of records Sweep removes when given
	// a limit <= 0.
	DefaultSweepLimit = 1000
)

var (
	// ErrFenced is returned by a Store's Finish, Fail and Extend when the
	// record is no longer processing under the fence presented: its lease
	// ended and another delivery took it over (Fence+1), it was finished,
	// or, long after its lease ended, it was swept. The holder's work must
	// not count.
	ErrFenced = errors.New("inbox: fenced out: the record was taken over")
	// ErrNotFound is returned by Store.Get for a message never claimed.
	ErrNotFound = errors.New("inbox: no record")
	// ErrNoID is the Err of the Dead outcome of a message without an ID
	// when Config.DeriveFrom is nil (or derives nothing, or a field it
	// derives from is empty): it can never be
	// de-duplicated, so it is never handled; dead-letter it with the
	// reason.
	ErrNoID = errors.New("inbox: message without an ID")
	// ErrInvalid is wrapped by the error of an invalid message ID or
	// group: empty, longer than MaxIDLen bytes, not UTF-8, or with a
	// control character.
	ErrInvalid = errors.New("inbox: invalid ID or group")
	// ErrTxUnsupported is returned by HandleTx when the Store does not
	// implement TxStore.
	ErrTxUnsupported = errors.New("inbox: the store cannot claim inside an SQL transaction")
	// ErrLeaseLost is the cause of a Handle handler's context when the
	// store refused to extend the lease (another delivery took the
	// message over, and the handler's work will be refused by the fence),
	// or no renewal confirmed the lease before it may have ended.
	ErrLeaseLost = errors.New("inbox: lease lost")
)

// Message is a message as a consumer received it. Only ID is the inbox's
// concern; the rest is for the handler.
type Message struct {
	// ID is the message's identity (NATS Nats-Msg-Id, AMQP message_id,
	// the outbox row's ID). Empty: derived by Config.DeriveFrom.
	ID      string
	Topic   string
	Key     string
	Headers map[string]string
	Payload []byte
}

// Delivery is what a handler receives: the message, with the group, the
// attempt and the fence its claim holds.
type Delivery struct {
	Message
	// Group is the consumer group.
	Group string
	// Attempt is this delivery's attempt, from 1.
	Attempt int
	// Fence is the claim's fence. In Handle's mode, pass it (and ID, the
	// idempotency key of a downstream call) to a downstream that can
	// refuse a stale fence.
	Fence int64
}

// Result says what an adapter does with a delivery.
type Result uint8

// The results of Handle and HandleTx.
const (
	// Processed: the handler ran and its effect is recorded. Ack.
	Processed Result = iota + 1
	// Duplicate: the message was processed before. Ack, do not handle.
	Duplicate
	// Retry: the handler (or the store) failed; the message is released
	// for redelivery. Nak (requeue) with Outcome.Delay.
	Retry
	// Dead: the message failed the maximum attempts, or cannot be
	// handled at all (ErrNoID). Terminate / dead-letter it.
	Dead
	// InProgress: another consumer holds the message's live lease. Nak
	// with Outcome.Delay (the lease's remainder); do not ack.
	InProgress
)

var resultNames = [...]string{Processed: "processed", Duplicate: "duplicate", Retry: "retry", Dead: "dead", InProgress: "in progress"}

// String returns the result's name ("processed", "duplicate", ...).
func (r Result) String() string {
	if int(r) < len(resultNames) && resultNames[r] != "" {
		return resultNames[r]
	}
	return fmt.Sprintf("inbox.Result(%d)", uint8(r))
}

// Ack reports whether the delivery is done with: Processed or Duplicate.
func (r Result) Ack() bool { return r == Processed || r == Duplicate }

// Outcome is the answer of Handle and HandleTx.
type Outcome struct {
	Result Result
	// ID is the message ID the record is kept under (derived if the
	// message had none).
	ID string
	// Attempt and Fence are the record's after the call (zero when no
	// record was touched).
	Attempt int
	Fence   int64
	// Delay is how long to wait before the redelivery, for Retry and
	// InProgress.
	Delay time.Duration
	// Err is the handler's error (Retry, Dead), ErrNoID, or the store's
	// error when Handle or HandleTx also return it.
	Err error
}

// Config configures an Inbox. The zero value of each field means its
// default; Group is required.
type Config struct {
	// Group is the consumer group: records are unique per (message ID,
	// group), so two groups each handle every message once. Required.
	Group string
	// MaxAttempts is the number of attempts after which a failing message
	// is dead. Default DefaultMaxAttempts (5).
	MaxAttempts int
	// Lease bounds how long a claim holds a message before another
	// delivery may take it over. Handle extends it every third of it
	// while the handler runs, and retries an extension that failed or
	// timed out (each attempt is bounded by a third) soon after. Default
	// DefaultLease (30 s).
	Lease time.Duration
	// Backoff is the delay before the redelivery of a message whose
	// attempt-th attempt failed. Default: 1 s doubled per attempt, at
	// most 1 min.
	Backoff func(attempt int) time.Duration
	// DeriveFrom, when a message has no ID, names the fields its ID is
	// derived from (DeriveID): the business key, the event type, the
	// version. Nil, or a result that is empty or has an empty field (a
	// field the message lacks): the message is Dead with ErrNoID, never
	// taken for another's duplicate.
	DeriveFrom func(m Message) []string
	// Observer, if set, is told of every message Handle and HandleTx
	// handle (idem.KindInbox): Start with Route the group, KeyHash
	// idem.HashKey("", the message ID) and Headers the message's headers
	// (a tracer continues the producer's trace from them); End with the
	// same and Outcome (processed, duplicate, retried, dead, in_flight),
	// N the attempt, Err the handler's or the store's error. The handler
	// runs with the context Start returned. Nil: nothing is reported.
	Observer idem.Observer
}

// Inbox de-duplicates the messages of one consumer group over a Store. It
// is safe for concurrent use.
type Inbox struct {
	store Store
	cfg   Config
}

// New returns an Inbox over s. cfg is required (for its Group) and is
// copied.
func New(s Store, cfg *Config) (*Inbox, error) {
	if s == nil {
		return nil, errors.New("inbox: New needs a Store")
	}
	if cfg == nil {
		return nil, errors.New("inbox: New needs a Config with a Group")
	}
	c := *cfg
	if err := validate("group", c.Group); err != nil {
		return nil, err
	}
	switch {
	case c.MaxAttempts == 0:
		c.MaxAttempts = DefaultMaxAttempts
	case c.MaxAttempts < 0:
		return nil, fmt.Errorf("inbox: MaxAttempts %d is negative", c.MaxAttempts)
	}
	switch {
	case c.Lease == 0:
		c.Lease = DefaultLease
	case c.Lease < 10*time.Millisecond:
		return nil, fmt.Errorf("inbox: Lease %v is shorter than 10ms", c.Lease)
	}
	if c.Backoff == nil {
		c.Backoff = defaultBackoff
	}
	return &Inbox{store: s, cfg: c}, nil
}

func defaultBackoff(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 7 {
		return time.Minute
	}
	return min(time.Second<<(attempt-1), time.Minute)
}

// Group returns the inbox's consumer group.
func (in *Inbox) Group() string { return in.cfg.Group }

// Store returns the inbox's store.
func (in *Inbox) Store() Store { return in.store }

// TxHandler runs a message's effect in tx.
type TxHandler func(ctx context.Context, tx *sql.Tx, d Delivery) error

// Handler runs a message's effect outside the store (a call to another
// service, an e-mail): the external-effect mode of Handle.
type Handler func(ctx context.Context, d Delivery) error

// Beginner begins transactions: a *sql.DB, or a wrapper of one.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// id returns the ID the message is kept under, or an Outcome to return.
func (in *Inbox) id(m Message) (string, *Outcome) {
	id := m.ID
	if id == "" && in.cfg.DeriveFrom != nil {
		// A missing (empty) field derives nothing: the ID of the fields
		// left would be shared by different messages, each after the
		// first taken for its duplicate.
		if f := in.cfg.DeriveFrom(m); len(f) > 0 && !slices.Contains(f, "") {
			id = DeriveID(f...)
		}
	}
	if id == "" {
		return "", &Outcome{Result: Dead, Err: ErrNoID}
	}
	if err := validate("message ID", id); err != nil {
		return "", &Outcome{Result: Dead, ID: id, Err: err}
	}
	return id, nil
}

// settle turns a claim that the caller did not win into an outcome.
func settle(id string, c Claim) Outcome {
	o := Outcome{ID: id, Attempt: c.Attempts, Fence: c.Fence}
	switch c.Status {
	case StatusSucceeded:
		o.Result = Duplicate
	case StatusDead:
		o.Result = Dead
	default:
		o.Result = InProgress
		o.Delay = max(c.LeaseUntil.Sub(c.Now), time.Millisecond)
	}
	return o
}

// storeFailed is the outcome of a store error: Retry after a short delay.
func storeFailed(id string, err error) (Outcome, error) {
	return Outcome{Result: Retry, ID: id, Delay: time.Second, Err: err}, err
}

// HandleTx handles m with h, whose effect runs in a transaction begun on
// db that also claims the message's record (TxStore.ClaimTx): the record
// commits succeeded together with the effect, or neither commits — so it
// is never seen succeeded before the effect is there. It needs a Store
// that implements TxStore (ErrTxUnsupported otherwise).
//
//   - A message already succeeded answers Duplicate without calling h; a
//     dead one answers Dead; one whose lease another consumer holds (in
//     Handle's mode) answers InProgress.
//   - Otherwise h runs in the transaction, which holds the record's row:
//     a concurrent delivery of the same message waits for it, and then
//     answers Duplicate (committed) or runs h itself (rolled back).
//   - h's error (or its panic, as a *PanicError) rolls the transaction back
//     and then records the failed attempt in the store: Retry with
//     Config.Backoff's delay, or Dead after Config.MaxAttempts attempts.
//     A failed message is redelivered and handled again, never taken for
//     a duplicate.
//   - A process that dies during h rolls the transaction back: the
//     message is as it was, and that attempt is not counted.
//
// The returned error is the store's or the transaction's (the outcome is
// then Retry, and m's state is unknown: a retry settles it); a handler's
// error is in Outcome.Err, with a nil error.
func (in *Inbox) HandleTx(ctx context.Context, db Beginner, m Message, h TxHandler) (Outcome, error) {
	obs := in.cfg.Observer
	if obs == nil {
		return in.handleTx(ctx, db, m, h)
	}
	ctx, e, start := in.start(ctx, obs, m)
	o, err := in.handleTx(ctx, db, m, h)
	in.end(ctx, obs, e, start, o, err)
	return o, err
}

func (in *Inbox) handleTx(ctx context.Context, db Beginner, m Message, h TxHandler) (Outcome, error) {
	ts, ok := in.store.(TxStore)
	if !ok {
		return Outcome{}, ErrTxUnsupported
	}
	if db == nil || h == nil {
		return Outcome{}, errors.New("inbox: HandleTx needs a database and a handler")
	}
	id, bad := in.id(m)
	if bad != nil {
		return *bad, nil
	}
	g := in.cfg.Group
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return storeFailed(id, fmt.Errorf("inbox: begin: %w", err))
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()
	c, err := ts.ClaimTx(ctx, tx, g, id, in.cfg.MaxAttempts)
	if err != nil {
		return storeFailed(id, fmt.Errorf("inbox: claim: %w", err))
	}
	if !c.Claimed {
		done = true
		_ = tx.Rollback()
		return settle(id, c), nil
	}
	d := Delivery{Message: m, Group: g, Attempt: c.Attempts, Fence: c.Fence}
	d.ID = id
	if herr := call(ctx, func(ctx context.Context) error { return h(ctx, tx, d) }); herr != nil {
		done = true
		_ = tx.Rollback()
		return in.recordFailure(ctx, id, herr)
	}
	done = true
	if err := tx.Commit(); err != nil {
		return storeFailed(id, fmt.Errorf("inbox: commit: %w", err))
	}
	return Outcome{Result: Processed, ID: id, Attempt: c.Attempts, Fence: c.Fence}, nil
}

// recordFailure records the failed attempt of a claim that rolled back
// with its transaction: a claim outside any transaction counts the
// attempt, and Fail ends it.
func (in *Inbox) recordFailure(ctx context.Context, id string, herr error) (Outcome, error) {
	g := in.cfg.Group
	// The handler's context may have ended (the cause of its error): the
	// failure is recorded all the same.
	ctx, cancel := in.detach(ctx)
	defer cancel()
	c, err := in.store.Claim(ctx, g, id, in.cfg.Lease, in.cfg.MaxAttempts)
	if err != nil {
		return storeFailed(id, fmt.Errorf("inbox: record failure (%v): %w", herr, err))
	}
	if !c.Claimed {
		o := settle(id, c)
		if o.Result == Dead {
			o.Err = herr
		}
		return o, nil
	}
	return in.fail(ctx, id, c, herr)
}

// fail ends the claimed attempt c, which failed with herr.
func (in *Inbox) fail(ctx context.Context, id string, c Claim, herr error) (Outcome, error) {
	st, err := in.store.Fail(ctx, in.cfg.Group, id, c.Fence, in.cfg.MaxAttempts, reason(herr))
	if err != nil {
		return storeFailed(id, fmt.Errorf("inbox: fail (%v): %w", herr, err))
	}
	o := Outcome{ID: id, Attempt: c.Attempts, Fence: c.Fence, Err: herr}
	if st == StatusDead {
		o.Result = Dead
	} else {
		o.Result = Retry
		o.Delay = in.cfg.Backoff(c.Attempts)
	}
	return o, nil
}

// Handle handles m with h in the external-effect mode: the claim commits
// first (the record is processing, with a lease and a fence), h runs
// outside any transaction of the store, with the fence and the message
// ID (the idempotency key of its downstream call), and then Finish marks
// the record succeeded — only if the fence still holds it.
//
// While h runs, Handle extends the lease every third of Config.Lease
// (each attempt bounded by a third of it; one that fails or times out is
// retried soon after, with a backoff); if the store refuses (another
// delivery took the message over after the lease ended), h's context is
// cancelled with cause ErrLeaseLost, and so it is, at the latest, when
// the lease last confirmed may have ended (counted on the local clock
// from just before the call that confirmed it was sent), whether or not a
// renewal still waits for its answer. A
// process that dies during h leaves the record processing until its
// lease ends; the redelivery then takes it over with a higher fence (and
// an attempt more), and the old holder's Finish is refused (ErrFenced).
// The effect itself may then have happened twice downstream unless the
// downstream de-duplicates by the message ID or refuses stale fences:
// this mode guarantees the record, not the effect.
//
// Finish (or Fail, after h's error) runs even if ctx ended while h ran,
// for at most Config.Lease: a store that does not answer by then leaves
// the record to the redelivery (Retry, with the store's error).
//
// Results are as HandleTx's. A Finish refused by the fence returns
// ErrFenced with a Retry outcome: the message belongs to another
// delivery now.
func (in *Inbox) Handle(ctx context.Context, m Message, h Handler) (Outcome, error) {
	obs := in.cfg.Observer
	if obs == nil {
		return in.handle(ctx, m, h)
	}
	ctx, e, start := in.start(ctx, obs, m)
	o, err := in.handle(ctx, m, h)
	in.end(ctx, obs, e, start, o, err)
	return o, err
}

func (in *Inbox) handle(ctx context.Context, m Message, h Handler) (Outcome, error) {
	if h == nil {
		return Outcome{}, errors.New("inbox: Handle needs a handler")
	}
	id, bad := in.id(m)
	if bad != nil {
		return *bad, nil
	}
	g := in.cfg.Group
	sent := time.Now() // the store counts the lease from no earlier than this
	c, err := in.store.Claim(ctx, g, id, in.cfg.Lease, in.cfg.MaxAttempts)
	if err != nil {
		return storeFailed(id, fmt.Errorf("inbox: claim: %w", err))
	}
	if !c.Claimed {
		return settle(id, c), nil
	}
	d := Delivery{Message: m, Group: g, Attempt: c.Attempts, Fence: c.Fence}
	d.ID = id

	hctx, cancel := context.WithCancelCause(ctx)
	wctx, stop := context.WithCancel(hctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		in.watch(wctx, cancel, g, id, c.Fence, sent)
	}()
	herr := call(hctx, func(ctx context.Context) error { return h(ctx, d) })
	stop() // cancels a renewal in flight: the handler's outcome waits for none
	<-watched
	cancel(nil)

	// The outcome is recorded even if ctx ended meanwhile.
	sctx, scancel := in.detach(ctx)
	defer scancel()
	if herr != nil {
		o, err := in.fail(sctx, id, c, herr)
		if errors.Is(err, ErrFenced) {
			o.Result, o.Delay = Retry, in.cfg.Lease
		}
		return o, err
	}
	if err := in.store.Finish(sctx, g, id, c.Fence); err != nil {
		o, err := storeFailed(id, fmt.Errorf("inbox: finish: %w", err))
		o.Attempt, o.Fence = c.Attempts, c.Fence
		return o, err
	}
	return Outcome{Result: Processed, ID: id, Attempt: c.Attempts, Fence: c.Fence}, nil
}

// watch renews the lease of the claim of (g, id) with fence, sent at
// sent, until ctx ends. It cancels the handler's context with
// ErrLeaseLost (lost) when the store refuses a renewal, and at the latest
// when the lease last confirmed may have ended, counted on the local
// clock from just before the call that confirmed it was sent: a renewal
// still waiting for its answer then does not keep the handler going, and
// an answer that comes after it does not revive the claim. A renewal is
// sent every third of the lease; each attempt is bounded by a third of
// the lease and by the end of the lease last confirmed, and one that
// fails or times out is retried after retry.After.
func (in *Inbox) watch(ctx context.Context, lost context.CancelCauseFunc, g, id string, fence int64, sent time.Time) {
	lease := in.cfg.Lease
	validUntil := sent.Add(lease)
	expiry := time.AfterFunc(time.Until(validUntil), func() { lost(ErrLeaseLost) })
	defer expiry.Stop()
	t := time.NewTimer(max(min(lease/3, time.Until(validUntil)), 0))
	defer t.Stop()
	var wait time.Duration // after the last renewal, if it failed
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if !now.Before(validUntil) {
			lost(ErrLeaseLost)
			return
		}
		deadline := now.Add(lease / 3)
		if validUntil.Before(deadline) {
			deadline = validUntil
		}
		actx, cancel := context.WithDeadline(ctx, deadline)
		asked := time.Now()
		err := in.store.Extend(actx, g, id, fence, lease)
		cancel()
		now = time.Now()
		switch {
		case errors.Is(err, ErrFenced), !now.Before(validUntil):
			lost(ErrLeaseLost)
			return
		case err != nil:
			wait = retry.After(wait, lease)
			t.Reset(min(wait, validUntil.Sub(now)))
		default:
			validUntil = asked.Add(lease)
			if !expiry.Reset(validUntil.Sub(now)) {
				return // it fired: the handler's context is cancelled
			}
			wait = 0
			t.Reset(min(lease/3, validUntil.Sub(now)))
		}
	}
}

// start reports the handling of m to obs.
func (in *Inbox) start(ctx context.Context, obs idem.Observer, m Message) (context.Context, idem.Event, time.Time) {
	e := idem.Event{Kind: idem.KindInbox, Route: in.cfg.Group, Headers: m.Headers}
	if id, bad := in.id(m); bad == nil {
		e.KeyHash = idem.HashKey("", id)
	}
	if c := obs.Start(ctx, e); c != nil {
		ctx = c
	}
	return ctx, e, time.Now()
}

// outcomes are the idem.Event outcomes of the Results.
var outcomes = [...]string{
	Processed: idem.OutcomeProcessed, Duplicate: idem.OutcomeDuplicate, Retry: idem.OutcomeRetried,
	Dead: idem.OutcomeDead, InProgress: idem.OutcomeInFlight,
}

// end reports the end of a handling that Start reported as e.
func (in *Inbox) end(ctx context.Context, obs idem.Observer, e idem.Event, start time.Time, o Outcome, err error) {
	e.Duration = time.Since(start)
	e.Headers = nil
	if int(o.Result) < len(outcomes) {
		e.Outcome = outcomes[o.Result]
	}
	if e.Outcome == "" {
		e.Outcome = idem.OutcomeError // a misuse: no handler, no database
	}
	e.N = int64(o.Attempt)
	e.Err = err
	if e.Err == nil {
		e.Err = o.Err
	}
	obs.End(ctx, e)
}

// detach returns a context for recording an attempt's end: not
// cancelled with ctx (what the handler did must be recorded even when the
// consumer stops), but ended after Config.Lease, so that a store whose
// connection stalls cannot hold the caller forever. A record left
// unsettled is the redelivery's to settle.
func (in *Inbox) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), in.cfg.Lease)
}

// call runs f, turning its panic into a *PanicError.
func call(ctx context.Context, f func(context.Context) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r}
		}
	}()
	return f(ctx)
}

// PanicError is the Outcome.Err of a handler that panicked: the attempt
// counts as failed and the message is released.
type PanicError struct{ Value any }

// Error reports the panic's value.
func (e *PanicError) Error() string { return fmt.Sprintf("inbox: handler panicked: %v", e.Value) }

// DeriveID returns the ID of a message that has none, derived from the
// fields that identify it (its business key, event type, version): the
// SHA-256 of the fields, each prefixed by its length (so ("ab","c") and
// ("a","bc") differ), as "sha256:" and 64 hex characters.
func DeriveID(fields ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, f := range fields {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Sweep removes up to limit (<= 0: DefaultSweepLimit) records of every
// group that no delivery works on any more (Store.Sweep): succeeded, dead
// and failed records last updated more than retention ago, and
// processing records whose lease ended more than retention ago — failed
// messages whose redelivery never came (the broker gave up: maximum
// deliveries, expiry) and messages whose consumer died and that were
// never redelivered. A processing record whose lease is live, or ended
// less than retention ago, stays. Call it now and then: nothing else
// removes failed and abandoned records.
//
// A message redelivered after its record was swept starts anew, as if
// it were new: a succeeded message's effect runs again, and a failed or
// dead message's attempts count from 1 again (a poison message gets
// Config.MaxAttempts more attempts). A holder of a swept record that is
// still running (its lease ended more than retention ago) is refused by
// Finish, Fail and Extend with ErrFenced, and nothing is recorded for it.
// The new record's fences start again at 1, though: were such a holder to
// present the very fence the new record has reached, it would be taken
// for the new record's holder. So keep retention longer than the broker
// redelivers (its de-duplication window, its maximum age, its delivery
// limit times the backoff) and far longer than a handler can outlive its
// lease.
func (in *Inbox) Sweep(ctx context.Context, retention time.Duration, limit int) (int, error) {
	if limit <= 0 {
		limit = DefaultSweepLimit
	}
	if retention < 0 {
		return 0, fmt.Errorf("inbox: sweep: negative retention %v", retention)
	}
	return in.store.Sweep(ctx, retention, limit)
}

func reason(err error) string {
	s := err.Error()
	if len(s) <= MaxReasonLen {
		return s
	}
	s = s[:MaxReasonLen]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// Validate reports whether s can be a message ID or a group: 1 to
// MaxIDLen bytes of UTF-8 without control characters. The error wraps
// ErrInvalid.
func Validate(s string) error { return validate("value", s) }

func validate(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	case len(s) > MaxIDLen:
		return fmt.Errorf("%w: %s of %d bytes, more than %d", ErrInvalid, what, len(s), MaxIDLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s not valid UTF-8", ErrInvalid, what)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return fmt.Errorf("%w: %s has a control character at byte %d", ErrInvalid, what, i)
	}
	return nil
}
