package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Defaults of RelayConfig.
const (
	DefaultBatchSize     = 100
	DefaultPollInterval  = time.Second
	DefaultRetryDelay    = time.Second
	DefaultRetention     = 24 * time.Hour
	DefaultSweepInterval = 10 * time.Minute
	DefaultSweepLimit    = 1000
	DefaultBacklogPeriod = 15 * time.Second
)

// RelayConfig configures a Relay. The zero value (or nil) means the
// defaults.
type RelayConfig struct {
	// BatchSize is the most messages a claim returns. Default 100.
	BatchSize int
	// PollInterval is how long the relay waits for new messages after a
	// claim that found none, unless the store's Notifier wakes it first.
	// Default 1 s.
	PollInterval time.Duration
	// RetryDelay is how long the relay waits after a failed publish or a
	// store error (unless woken). Default 1 s.
	RetryDelay time.Duration
	// Retention is how long sent messages stay in the store before the
	// relay sweeps them. Default 24 h; negative: the relay never sweeps.
	Retention time.Duration
	// SweepInterval is the time between two sweeps. Default 10 min.
	SweepInterval time.Duration
	// SweepLimit is the most messages one sweep removes. Default 1000.
	SweepLimit int
	// Logger receives publish and store failures. Nil: discarded.
	Logger *slog.Logger
	// Observer, if set, is told of each batch the relay publishes
	// (idem.KindOutbox, Op idem.OpPublish: Start and End, N the messages
	// marked sent, Err the publish or mark failure) and, while Run runs
	// over a BacklogStore, of the backlog every BacklogPeriod (an End
	// alone, Op idem.OpBacklog: N the pending messages, Age the oldest's
	// wait). Nil: nothing is reported, and the backlog is not measured.
	Observer idem.Observer
	// Name is the relay's Route in what it reports to Observer: a bounded
	// name ("orders"). Default "".
	Name string
	// BacklogPeriod is the time between two measures of the backlog.
	// Default 15 s.
	BacklogPeriod time.Duration
}

// Relay moves messages from a Store to a Publisher: it claims pending
// messages, publishes them in order, and marks sent those the publisher
// confirmed. Several relays, in one process or many, may run over one
// store at once.
type Relay struct {
	s   Store
	p   Publisher
	cfg RelayConfig
	log *slog.Logger

	sweepMu     sync.Mutex
	lastSweep   time.Time
	lastBacklog time.Time
}

// NewRelay returns a Relay from s to p. cfg is copied; nil means the
// defaults.
func NewRelay(s Store, p Publisher, cfg *RelayConfig) (*Relay, error) {
	if s == nil || p == nil {
		return nil, errors.New("outbox: NewRelay: nil Store or Publisher")
	}
	var c RelayConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.BatchSize < 0, c.PollInterval < 0, c.RetryDelay < 0, c.SweepInterval < 0, c.SweepLimit < 0, c.BacklogPeriod < 0:
		return nil, fmt.Errorf("outbox: NewRelay: negative setting in %+v", c)
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.SweepLimit == 0 {
		c.SweepLimit = DefaultSweepLimit
	}
	if c.BacklogPeriod == 0 {
		c.BacklogPeriod = DefaultBacklogPeriod
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Relay{s: s, p: p, cfg: c, log: log}, nil
}

// PublishError is returned by Once when the publisher refused messages.
// The messages it published before are marked sent; the refused ones, and
// those of the same keys after them, stay pending.
type PublishError struct {
	// ID is the first refused message's ID, Err the publisher's error.
	ID  string
	Err error
	// Failed is how many messages were refused or held back.
	Failed int
}

func (e *PublishError) Error() string {
	return fmt.Sprintf("outbox: publish %s (and %d held back): %v", e.ID, e.Failed-1, e.Err)
}

func (e *PublishError) Unwrap() error { return e.Err }

// Once runs one cycle: it claims a batch, publishes its messages in
// order, and marks sent those the publisher confirmed. It returns how many
// it marked sent. A publish failure skips the rest of that message's key
// in the batch (the next cycle starts with it) and is returned as a
// *PublishError after the others were marked. A batch that is a Deadliner
// is published only until four fifths of its remaining lease have passed
// (a publish still running then is cut short, and fails): the rest stays
// pending for the next cycle, and what was confirmed is marked in time.
// A message is published without the reserved headers (see
// Message.Validate) that a row added by an older build may carry; the
// relay logs their names and the message's ID.
func (r *Relay) Once(ctx context.Context) (int, error) {
	b, err := r.s.Claim(ctx, r.cfg.BatchSize)
	if err != nil {
		return 0, err
	}
	msgs := b.Messages()
	if len(msgs) == 0 {
		return 0, b.Release(ctx)
	}
	obs := r.cfg.Observer
	if obs == nil {
		return r.publish(ctx, b, msgs)
	}
	e := idem.Event{Kind: idem.KindOutbox, Op: idem.OpPublish, Route: r.cfg.Name}
	if c := obs.Start(ctx, e); c != nil {
		ctx = c
	}
	start := time.Now()
	n, err := r.publish(ctx, b, msgs)
	e.Duration, e.N, e.Err, e.Outcome = time.Since(start), int64(n), err, idem.OutcomeOK
	if err != nil {
		e.Outcome = idem.OutcomeError
	}
	obs.End(ctx, e)
	return n, err
}

// publish publishes the messages of b and ends it.
func (r *Relay) publish(ctx context.Context, b Batch, msgs []Message) (int, error) {
	var err error
	// Publish while the batch's lease leaves time to mark: a fifth of it
	// is kept for the mark. The messages not published then are claimed
	// again by the next cycle.
	pctx := ctx
	if d, ok := b.(Deadliner); ok {
		if end := d.Deadline(); !end.IsZero() {
			var cancel context.CancelFunc
			pctx, cancel = context.WithDeadline(ctx, end.Add(-time.Until(end)/5))
			defer cancel()
		}
	}
	var (
		sent    = make([]string, 0, len(msgs))
		blocked map[string]bool
		perr    *PublishError
	)
	for _, m := range msgs {
		if m.Key != "" && blocked[m.Key] {
			perr.Failed++
			continue
		}
		if err := pctx.Err(); err != nil {
			break
		}
		if dropped := dropReserved(&m); dropped != nil {
			r.log.WarnContext(ctx, "outbox: relay: publishing a message without the reserved headers it was added with (by a build that did not refuse them)",
				"id", m.ID, "dropped", dropped)
		}
		if err := r.p.Publish(pctx, m); err != nil {
			if perr == nil {
				perr = &PublishError{ID: m.ID, Err: err}
			}
			perr.Failed++
			if m.Key != "" {
				if blocked == nil {
					blocked = map[string]bool{}
				}
				blocked[m.Key] = true
			}
			continue
		}
		sent = append(sent, m.ID)
	}
	if len(sent) == 0 {
		err = b.Release(context.WithoutCancel(ctx))
	} else {
		// The mark runs even if ctx ended: what was confirmed should be
		// marked (it is published again otherwise, harmlessly).
		err = b.MarkSent(context.WithoutCancel(ctx), sent)
	}
	if err != nil {
		return 0, err
	}
	if perr != nil {
		return len(sent), perr
	}
	return len(sent), ctx.Err()
}

// dropReserved removes from m's headers those that Validate refuses as
// reserved (see Message.Validate), which a row added by an older build
// may carry: published, they would make the broker act on the message
// (refuse it forever, roll up or purge its subject, route copies) or fail
// every publish of it, holding its key back. It returns their names,
// sorted (nil: none); m's map is not changed, a copy replaces it.
func dropReserved(m *Message) []string {
	var dropped []string
	for name := range m.Headers {
		if reservedHeader(name) != "" {
			dropped = append(dropped, name)
		}
	}
	if dropped == nil {
		return nil
	}
	slices.Sort(dropped)
	h := maps.Clone(m.Headers)
	for _, name := range dropped {
		delete(h, name)
	}
	m.Headers = h
	return dropped
}

// Run relays until ctx ends, and then returns nil. It runs Once again at
// once while Once publishes something, and otherwise waits PollInterval,
// or less when the store is a Notifier and wakes it. It sweeps sent
// messages every SweepInterval unless Retention is negative. Failures are
// logged and retried after RetryDelay.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	if n, ok := r.s.(Notifier); ok {
		wg.Go(func() { r.listen(ctx, n, signal) })
	}
	defer wg.Wait()
	for ctx.Err() == nil {
		r.maybeSweep(ctx)
		r.maybeBacklog(ctx)
		n, err := r.Once(ctx)
		wait := r.cfg.PollInterval
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			r.log.WarnContext(ctx, "outbox: relay", "published", n, "err", err)
			wait = r.cfg.RetryDelay
		case n > 0:
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// listen runs n.Listen until ctx ends, again after RetryDelay when it
// fails; ErrNoNotify ends it.
func (r *Relay) listen(ctx context.Context, n Notifier, wake func()) {
	for {
		err := n.Listen(ctx, wake)
		if ctx.Err() != nil || errors.Is(err, ErrNoNotify) {
			return
		}
		r.log.WarnContext(ctx, "outbox: relay listen", "err", err)
		wake() // a notification may have been missed
		t := time.NewTimer(r.cfg.RetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// maybeSweep sweeps when SweepInterval has passed since the last sweep.
func (r *Relay) maybeSweep(ctx context.Context) {
	if r.cfg.Retention < 0 {
		return
	}
	r.sweepMu.Lock()
	due := r.lastSweep.IsZero() || time.Since(r.lastSweep) >= r.cfg.SweepInterval
	if due {
		r.lastSweep = time.Now()
	}
	r.sweepMu.Unlock()
	if !due {
		return
	}
	if _, err := r.s.Sweep(ctx, r.cfg.Retention, r.cfg.SweepLimit); err != nil && ctx.Err() == nil {
		r.log.WarnContext(ctx, "outbox: relay sweep", "err", err)
	}
}

// maybeBacklog reports the backlog to the Observer when BacklogPeriod has
// passed since the last report.
func (r *Relay) maybeBacklog(ctx context.Context) {
	obs := r.cfg.Observer
	bs, ok := r.s.(BacklogStore)
	if obs == nil || !ok {
		return
	}
	r.sweepMu.Lock()
	due := r.lastBacklog.IsZero() || time.Since(r.lastBacklog) >= r.cfg.BacklogPeriod
	if due {
		r.lastBacklog = time.Now()
	}
	r.sweepMu.Unlock()
	if !due {
		return
	}
	start := time.Now()
	b, err := bs.Backlog(ctx)
	if ctx.Err() != nil {
		return
	}
	e := idem.Event{Kind: idem.KindOutbox, Op: idem.OpBacklog, Route: r.cfg.Name, Outcome: idem.OutcomeOK,
		Duration: time.Since(start), N: b.Pending, Age: b.Age, Err: err}
	if err != nil {
		e.Outcome = idem.OutcomeError
		r.log.WarnContext(ctx, "outbox: relay backlog", "err", err)
	}
	obs.End(ctx, e)
}
