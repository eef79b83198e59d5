package inbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Process handles one message and says what to do with its delivery: an
// Inbox's HandleTx or Handle (see Inbox.ProcessTx and Inbox.Process), or
// a function of the caller's that calls one of them. A non-nil error is
// the store's (or the transaction's): the message's state is unknown and
// a later call settles it.
type Process func(ctx context.Context, m Message) (Outcome, error)

// ProcessTx returns a Process that handles each message with
// in.HandleTx(ctx, db, m, h).
func (in *Inbox) ProcessTx(db Beginner, h TxHandler) Process {
	return func(ctx context.Context, m Message) (Outcome, error) {
		return in.HandleTx(ctx, db, m, h)
	}
}

// Process returns a Process that handles each message with
// in.Handle(ctx, m, h), the external-effect mode.
func (in *Inbox) Process(h Handler) Process {
	return func(ctx context.Context, m Message) (Outcome, error) {
		return in.Handle(ctx, m, h)
	}
}

// BrokerDelivery is one delivery of a message by a broker, as a broker
// adapter hands it to a Consumer: the message and the broker's means to
// settle it. Each method that talks to the broker is bounded by the
// adapter (its own timeout) and by ctx.
type BrokerDelivery interface {
	// Message is the message as the inbox sees it. Its ID may be empty
	// (the producer set none).
	Message() Message
	// FallbackID is the ID of a message without one when
	// ConsumerConfig.DeriveFrom derives none (NATS: the stream, the
	// sequence and the stream's timestamp), or "" if the broker has none
	// (the message is then Dead with ErrNoID).
	FallbackID() string
	// Delivered counts the broker's deliveries of the message, this one
	// included, from 1; 0 if the broker does not count them.
	Delivered() int
	// Ack settles the delivery as done: the broker will not deliver it
	// again. It returns once the broker confirmed it, where it can.
	Ack(ctx context.Context) error
	// Nak hands the delivery back to the broker, to be delivered again
	// after delay (as soon as the broker can).
	Nak(ctx context.Context, delay time.Duration) error
	// InProgress tells the broker that the delivery is still being
	// handled, so that it does not deliver it again meanwhile; a no-op
	// where the broker has no ack deadline.
	InProgress(ctx context.Context) error
	// DeadLetter publishes the dead copy of the message, with reason and
	// the outcome that made it dead, and returns once the broker
	// confirmed it. An adapter that leaves dead letters to the broker
	// (a queue's own dead-letter exchange) does nothing here.
	DeadLetter(ctx context.Context, reason string, o Outcome) error
	// Term settles a dead (and dead-lettered) delivery: the broker will
	// not deliver it again.
	Term(ctx context.Context, reason string) error
}

// Action is what a Consumer did with a delivery.
type Action uint8

// Actions.
const (
	// Acked: the outcome was Processed or Duplicate; the delivery was
	// acked.
	Acked Action = iota + 1
	// Naked: Retry or InProgress (or the consumer stopped first); the
	// delivery was handed back with a delay.
	Naked
	// DeadLettered: its dead copy was published and the delivery
	// terminated.
	DeadLettered
	// Terminated: the delivery was terminated without being handled (an
	// adapter's own decision: e.g. a dead letter delivered back to its
	// consumer).
	Terminated
)

var actionNames = [...]string{Acked: "acked", Naked: "naked", DeadLettered: "dead-lettered", Terminated: "terminated"}

// String returns the action's name.
func (a Action) String() string {
	if int(a) < len(actionNames) && actionNames[a] != "" {
		return actionNames[a]
	}
	return fmt.Sprintf("inbox.Action(%d)", uint8(a))
}

// Settled is what Consumer.Settle did with a delivery.
type Settled struct {
	// Message is the message as the Process saw it (its ID derived or
	// the fallback when it had none).
	Message Message
	// Delivered is the broker's delivery count (0: unknown).
	Delivered int
	// Outcome is the Process's last answer; Action what was done.
	Outcome Outcome
	Action  Action
	// StoreErrors counts the calls of the Process that returned an error
	// (retried in place); Err is the last of those errors, or the
	// failure of the action (an ack unconfirmed), nil otherwise.
	StoreErrors int
	Err         error
}

// Defaults of ConsumerConfig.
const (
	// DefaultRetryMin and DefaultRetryMax bound the default
	// ConsumerConfig.Backoff: from 100 ms, doubling, to 10 s.
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 10 * time.Second
	// DefaultStopNak is the delay of the nak of a delivery that the
	// consumer's stop interrupted (a store error or a dead-letter
	// publish being retried).
	DefaultStopNak = time.Second
)

// minRetryWait is the shortest wait between two retries of a store
// error or of a dead-letter publish, whatever ConsumerConfig.Backoff
// says.
const minRetryWait = 10 * time.Millisecond

// ConsumerConfig configures a Consumer. The zero value of each field
// means its default; Process is required.
type ConsumerConfig struct {
	// Process handles each message. Required.
	Process Process
	// MaxDeliver is the client-side delivery limit: a delivery that is
	// the MaxDeliver-th (by BrokerDelivery.Delivered) and would be
	// handed back with a Retry is dead-lettered instead. An InProgress
	// is handed back whatever its count: another consumer holds the
	// message's live lease and settles it. 0: none (the inbox's
	// MaxAttempts alone decides).
	MaxDeliver int
	// Heartbeat is how often InProgress is sent while a delivery is held
	// (its Process runs, a store error or a dead-letter publish is being
	// retried). 0: never (a broker without an ack deadline).
	Heartbeat time.Duration
	// Backoff is the wait before the n-th retry (from 1) of a Process
	// that returned a store error, or of a dead-letter publish that
	// failed. Default: from DefaultRetryMin, doubling, at most
	// DefaultRetryMax, each wait drawn in [d/2, d]. A wait under 10 ms
	// (0 or negative included) is taken as 10 ms, so that a store down
	// is not called in a tight loop; a panic, as DefaultBackoff.
	Backoff func(n int) time.Duration
	// DeriveFrom, when a message has no ID, names the fields its ID is
	// derived from (DeriveID), before BrokerDelivery.FallbackID is used:
	// for an event that its producer sent without an ID, its business
	// number, event type and version — e.g.
	//
	//	func(m inbox.Message) []string {
	//		return []string{m.Headers["Order-No"], m.Headers["Event-Type"], m.Headers["Event-Version"]}
	//	}
	//
	// so that two publishes of one business event are one message. A
	// result that is empty or has an empty field derives nothing.
	DeriveFrom func(m Message) []string
	// Logger receives store errors, retries and settlement failures.
	// Nil: discarded. A line identifies its message by idem.key_hash,
	// never by its ID.
	Logger *slog.Logger
	// Name starts the consumer's log messages (e.g. "natsjs"). Default
	// "inbox".
	Name string
}

// Consumer is the consumer protocol, once for every broker: it takes a
// delivery through the Process (claim, run, record) to its end — ack,
// nak with the inbox's backoff, or dead-letter — sending InProgress while
// it holds it, turning a panic into a failed attempt, and retrying a
// store error in place (with a growing, bounded backoff), so that an
// outage of the store costs time, never a delivery nor an attempt. A
// broker adapter receives the deliveries and hands each to Settle. It is
// safe for concurrent use.
type Consumer struct {
	cfg ConsumerConfig
	log *slog.Logger
}

// NewConsumer returns a Consumer of cfg, which is copied.
func NewConsumer(cfg *ConsumerConfig) (*Consumer, error) {
	if cfg == nil || cfg.Process == nil {
		return nil, errors.New("inbox: NewConsumer needs a Process")
	}
	c := *cfg
	if c.MaxDeliver < 0 || c.Heartbeat < 0 {
		return nil, fmt.Errorf("inbox: NewConsumer: negative MaxDeliver or Heartbeat")
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.Name == "" {
		c.Name = "inbox"
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Consumer{cfg: c, log: log}, nil
}

// DefaultBackoff is ConsumerConfig.Backoff's default: DefaultRetryMin
// doubled n-1 times, at most DefaultRetryMax, drawn in [d/2, d].
func DefaultBackoff(n int) time.Duration {
	d := DefaultRetryMax
	if n < 1 {
		n = 1
	}
	if n <= 7 {
		d = min(DefaultRetryMin<<(n-1), DefaultRetryMax)
	}
	return d/2 + rand.N(d/2+1)
}

// Settle takes d to its end and reports what it did. ctx is the
// consumer's: the Process runs without its cancellation (a shutdown is
// not a failed attempt), and its end only stops the retries of a store
// error or of a dead-letter publish, after which d is naked with
// DefaultStopNak. Settle returns after d is settled.
//
//   - The Process's Processed and Duplicate: Ack.
//   - Retry and InProgress: Nak with the Outcome's Delay; a Retry on
//     the MaxDeliver-th delivery is dead-lettered instead.
//   - Dead: DeadLetter (retried with Backoff until it succeeds), then
//     Term.
//   - A store error (the Process returned a non-nil error): the Process
//     is called again after Backoff, d being held meanwhile (InProgress).
//   - A panic of the Process: a Retry, as a handler's panic is. A panic
//     of DeriveFrom: Dead, as a message without an ID is (the Process is
//     not called; a redelivery would panic again).
func (c *Consumer) Settle(ctx context.Context, d BrokerDelivery) Settled {
	m := d.Message()
	id, derr := c.id(m, d)
	m.ID = id
	s := Settled{Message: m, Delivered: d.Delivered()}
	hctx := context.WithoutCancel(ctx)

	stop := c.heartbeat(hctx, d)
	defer stop()

	for n := 1; ; n++ {
		if derr != nil {
			// DeriveFrom panicked: the message has no ID it can be
			// kept under, as one without an ID (ErrNoID), and a
			// redelivery would panic again (on a broker that counts no
			// deliveries, for ever). Dead-lettered with the panic, to
			// be published again once DeriveFrom is fixed; the Process
			// never sees it.
			s.Outcome = Outcome{Result: Dead, Err: derr}
			break
		}
		o, err := c.call(hctx, m)
		s.Outcome = o
		if err == nil {
			break
		}
		s.StoreErrors, s.Err = n, err
		wait := c.backoff(n)
		c.log.WarnContext(ctx, c.cfg.Name+": store failed; retrying", c.attrs(m, s, slog.Any("err", err), slog.Duration("delay", wait))...)
		if !sleep(ctx, wait) {
			stop()
			s.Action = Naked
			s.Err = errors.Join(s.Err, c.nak(hctx, d, m, s, DefaultStopNak))
			return s
		}
	}
	s.Err = nil
	o := s.Outcome
	switch {
	case o.Result.Ack():
		stop()
		s.Action = Acked
		if err := d.Ack(hctx); err != nil {
			// Unconfirmed: if the ack was lost, the redelivery is a
			// duplicate and is acked then.
			s.Err = fmt.Errorf("%s: ack: %w", c.cfg.Name, err)
			c.log.WarnContext(ctx, c.cfg.Name+": ack failed", c.attrs(m, s, slog.Any("err", err))...)
		}
	case o.Result == Dead:
		c.deadLetter(ctx, d, &s, reasonOf(o), stop)
	default: // Retry, InProgress, or a Process without an outcome
		// InProgress is never dead-lettered: another consumer holds the
		// message's live lease and settles it.
		if c.cfg.MaxDeliver > 0 && s.Delivered >= c.cfg.MaxDeliver && o.Result != InProgress {
			c.deadLetter(ctx, d, &s, fmt.Sprintf("delivered %d times (MaxDeliver), last: %s", s.Delivered, reasonOf(o)), stop)
			break
		}
		delay := o.Delay
		if o.Result != Retry && o.Result != InProgress && delay == 0 {
			delay = DefaultStopNak
		}
		stop()
		s.Action = Naked
		c.log.InfoContext(ctx, c.cfg.Name+": requeueing", c.attrs(m, s, slog.Duration("delay", delay), slog.Any("reason", o.Err))...)
		s.Err = c.nak(hctx, d, m, s, delay)
	}
	return s
}

// backoff is the wait before the n-th retry, at least minRetryWait;
// DefaultBackoff's if Backoff panics.
func (c *Consumer) backoff(n int) (d time.Duration) {
	defer func() {
		if r := recover(); r != nil {
			d = DefaultBackoff(n)
		}
	}()
	return max(c.cfg.Backoff(n), minRetryWait)
}

// id returns the ID m is handled under: its own, else the one
// DeriveFrom derives, else d's fallback; a panic of DeriveFrom is an
// error wrapping a *PanicError.
func (c *Consumer) id(m Message, d BrokerDelivery) (id string, err error) {
	if m.ID != "" {
		return m.ID, nil
	}
	if c.cfg.DeriveFrom != nil {
		var f []string
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("DeriveFrom: %w", &PanicError{Value: r})
				}
			}()
			f = c.cfg.DeriveFrom(m)
		}()
		if err != nil {
			return "", err
		}
		if len(f) > 0 && !slices.Contains(f, "") {
			return DeriveID(f...), nil
		}
	}
	return d.FallbackID(), nil
}

// call runs the Process, turning its panic into a Retry.
func (c *Consumer) call(ctx context.Context, m Message) (o Outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			o = Outcome{Result: Retry, ID: m.ID, Delay: DefaultStopNak, Err: &PanicError{Value: r}}
			err = nil
		}
	}()
	return c.cfg.Process(ctx, m)
}

func (c *Consumer) nak(ctx context.Context, d BrokerDelivery, m Message, s Settled, delay time.Duration) error {
	if err := d.Nak(ctx, delay); err != nil {
		c.log.WarnContext(ctx, c.cfg.Name+": nak failed", c.attrs(m, s, slog.Any("err", err))...)
		return fmt.Errorf("%s: nak: %w", c.cfg.Name, err)
	}
	return nil
}

// deadLetter publishes d's dead copy, retrying with Backoff until it is
// confirmed or ctx ends (d is then naked: its redelivery is Dead again),
// and terminates d. It calls stop (the heartbeat's) before it settles d.
func (c *Consumer) deadLetter(ctx context.Context, d BrokerDelivery, s *Settled, reason string, stop func()) {
	reason = cutReason(reason)
	hctx := context.WithoutCancel(ctx)
	for n := 1; ; n++ {
		err := d.DeadLetter(hctx, reason, s.Outcome)
		if err == nil {
			break
		}
		s.Err = fmt.Errorf("%s: dead-letter: %w", c.cfg.Name, err)
		wait := c.backoff(n)
		c.log.WarnContext(ctx, c.cfg.Name+": dead-letter publish failed; retrying", c.attrs(s.Message, *s, slog.String("reason", reason), slog.Any("err", err), slog.Duration("delay", wait))...)
		if !sleep(ctx, wait) {
			stop()
			s.Action = Naked
			s.Err = errors.Join(s.Err, c.nak(hctx, d, s.Message, *s, DefaultStopNak))
			return
		}
	}
	stop()
	s.Err = nil
	s.Action = DeadLettered
	c.log.WarnContext(ctx, c.cfg.Name+": dead message dead-lettered", c.attrs(s.Message, *s, slog.String("reason", reason))...)
	if err := d.Term(hctx, reason); err != nil {
		s.Err = fmt.Errorf("%s: term: %w", c.cfg.Name, err)
		c.log.WarnContext(ctx, c.cfg.Name+": term failed (the message may be dead-lettered again)", c.attrs(s.Message, *s, slog.Any("err", err))...)
	}
}

// heartbeat sends d's InProgress every Heartbeat until stop is called
// (stop may be called more than once), so that none follows the
// delivery's settlement.
func (c *Consumer) heartbeat(ctx context.Context, d BrokerDelivery) (stop func()) {
	if c.cfg.Heartbeat <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = d.InProgress(ctx)
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}

func (c *Consumer) attrs(m Message, s Settled, more ...any) []any {
	return append([]any{idem.LogKey("", m.ID, false), slog.Int("delivered", s.Delivered),
		slog.String("result", s.Outcome.Result.String()), slog.Int("attempt", s.Outcome.Attempt)}, more...)
}

// sleep waits d, or less if ctx ends first (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func reasonOf(o Outcome) string {
	switch {
	case o.Err != nil:
		return o.Err.Error()
	case o.Result == 0:
		return "no outcome"
	}
	return o.Result.String()
}

func cutReason(s string) string {
	if len(s) <= MaxReasonLen {
		return s
	}
	return reason(errors.New(s))
}
