package steps

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Config configures a Runner. A nil Config, or a zero field, means the
// default.
type Config struct {
	// MaxAttempts is how many attempts an operation gets (counted when
	// an attempt begins, so a process that crashes in the middle uses
	// one) before the completer leaves it dead. Default 10.
	MaxAttempts int
	// Backoff is the completer's wait after a first failed attempt;
	// each further failure doubles it, up to MaxBackoff, with ±20 %
	// jitter. Default 1 s; MaxBackoff default 5 min.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Interval is how often the completer (Start) looks for due
	// operations. Default 5 s.
	Interval time.Duration
	// Batch is how many due operations one pass takes up. Default 50.
	Batch int
	// Logger receives the completer's failures. Nil discards.
	Logger *slog.Logger
}

// Runner runs operations of steps under a Guard, and completes the ones
// their callers left: create it with New, Define its operations, and
// Start its completer (or call Complete from a job of your own).
type Runner struct {
	g   *idem.Guard
	j   Journal
	tj  TxJournal // j, if it runs local steps
	cfg Config

	mu      sync.Mutex
	ops     map[string]resumer
	stop    chan struct{}
	stopped chan struct{}
}

// resumer runs an operation the completer found due.
type resumer interface {
	resume(ctx context.Context, op Entry) (replayed bool, err error)
}

// New returns a Runner that runs operations under g's records and keeps
// them in j. When j is a TxJournal, it must keep its operations in the
// database of g's store, with g's store a TxCompleter there (as
// sqlstore's Store and StepJournal on one *sql.DB are).
func New(g *idem.Guard, j Journal, cfg *Config) (*Runner, error) {
	if g == nil {
		return nil, errors.New("steps: New needs an idem.Guard")
	}
	if j == nil {
		return nil, errors.New("steps: New needs a Journal")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.MaxAttempts < 0, c.Backoff < 0, c.MaxBackoff < 0, c.Interval < 0, c.Batch < 0:
		return nil, fmt.Errorf("steps: New: negative Config field in %+v", c)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.Backoff == 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Minute
	}
	c.MaxBackoff = max(c.MaxBackoff, c.Backoff)
	if c.Interval == 0 {
		c.Interval = 5 * time.Second
	}
	if c.Batch == 0 {
		c.Batch = 50
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Runner{g: g, j: j, cfg: c, ops: make(map[string]resumer)}
	r.tj, _ = j.(TxJournal)
	return r, nil
}

// Journal returns the Runner's journal (for an operator's Get and List).
func (r *Runner) Journal() Journal { return r.j }

// backoff is the wait after the attempt-th failed attempt.
// Neither the doubling nor the jitter may overflow (a MaxBackoff of
// math.MaxInt64 means no ceiling): a negative wait would make a failing
// operation due at once, on every pass.
func (r *Runner) backoff(attempt int) time.Duration {
	d, ceiling := r.cfg.Backoff, r.cfg.MaxBackoff
	for i := 1; i < attempt && d < ceiling; i++ {
		if d > ceiling/2 {
			d = ceiling
			break
		}
		d *= 2
	}
	d = min(d, ceiling)
	j := float64(d) * (0.8 + 0.4*rand.Float64())
	if j >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(j)
}

func (r *Runner) register(name string, op resumer) error {
	if err := checkName("operation", name); err != nil {
		return fmt.Errorf("steps: Define: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ops[name]; ok {
		return fmt.Errorf("steps: Define: operation %q defined twice", name)
	}
	r.ops[name] = op
	return nil
}

// Pass counts what one pass of the completer did.
type Pass struct {
	// Due is how many due operations it found (of every name).
	Due int
	// Finished: resumed and ended with an answer (a result or a
	// definite error); Failed: resumed and failed again (retryable);
	// Settled: found answered by another execution, or dead.
	Finished, Failed, Settled int
	// InFlight: another execution holds them (postponed).
	InFlight int
	// Errors: the store or the journal failed (left due).
	Errors int
}

// Complete runs one pass of the completer: for each operation Defined
// on r, it takes up to Batch due operations of that name, one after the
// other, and resumes each under a new execution of its key, from its
// first step not done. An operation that another execution holds is
// postponed by a lease; one whose record was completed meanwhile is
// settled done; one that used MaxAttempts is left dead (once the
// completer holds its key: its last run may still be alive, or have
// stored its answer). Operations of
// names r does not know (another service's, in the same tables) are not
// touched. It returns the first error of the journal's Due.
func (r *Runner) Complete(ctx context.Context) (Pass, error) {
	var p Pass
	r.mu.Lock()
	names := slices.Sorted(maps.Keys(r.ops))
	r.mu.Unlock()
	var first error
	for _, name := range names {
		due, err := r.j.Due(ctx, name, r.cfg.Batch)
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		p.Due += len(due)
		r.mu.Lock()
		rs := r.ops[name]
		r.mu.Unlock()
		for _, op := range due {
			if ctx.Err() != nil {
				return p, ctx.Err()
			}
			log := r.cfg.Logger.With(slog.String("steps.op", op.Name), idem.LogKey(op.Scope, op.Key, false))
			var err error
			if op.Attempts >= r.cfg.MaxAttempts {
				err = r.dead(ctx, op, &p, fmt.Sprintf("steps: %d attempts used (the last: %s)", op.Attempts, op.LastError))
			} else {
				err = r.resumeOne(ctx, rs, op, &p, log)
			}
			if err != nil {
				p.Errors++
				log.WarnContext(ctx, "steps: completer", slog.Any(idem.LogErr, err))
			}
		}
	}
	return p, first
}

func (r *Runner) resumeOne(ctx context.Context, rs resumer, op Entry, p *Pass, log *slog.Logger) error {
	replayed, err := rs.resume(ctx, op)
	var de *idem.DefiniteError
	var ue undecodableError
	switch {
	case errors.As(err, &ue):
		return r.dead(ctx, op, p, ue.Error())
	case replayed:
		return r.answered(ctx, op, p)
	case err == nil, errors.As(err, &de):
		p.Finished++
		return nil
	case errors.Is(err, idem.ErrInFlight):
		p.InFlight++
		return r.j.Postpone(ctx, op.Scope, op.Key, r.g.Config().Lease)
	case errors.Is(err, idem.ErrMismatch):
		// The key was released and is held by another request: that one
		// would have replaced this operation had it been one.
		p.Settled++
		return r.j.Settle(ctx, op, StateDead, "steps: the key is held by another request (other fingerprint)", 0)
	case errors.Is(err, errAttempted):
		p.Failed++
		log.InfoContext(ctx, "steps: completer: attempt failed", slog.Any(idem.LogErr, err))
		return nil
	default:
		return err
	}
}

// dead ends a due operation that the completer cannot run (it used its
// attempts, or its input does not decode here): dead with reason, unless
// a run is alive (it holds the key: postponed, as any operation in
// flight) or answered (its record completed). The completer holds the
// key while it settles the operation dead, then releases it, so that a
// client's retry runs it again.
func (r *Runner) dead(ctx context.Context, op Entry, p *Pass, reason string) error {
	x, res, err := r.g.Begin(ctx, op.Scope, op.Key, op.Fingerprint)
	if err != nil {
		return err
	}
	switch res.Outcome {
	case idem.Acquired:
	case idem.InFlight:
		p.InFlight++
		return r.j.Postpone(ctx, op.Scope, op.Key, r.g.Config().Lease)
	case idem.Completed:
		return r.answered(ctx, op, p)
	case idem.Mismatch:
		p.Settled++
		return r.j.Settle(ctx, op, StateDead, "steps: the key is held by another request (other fingerprint)", 0)
	default:
		return fmt.Errorf("steps: acquire: unknown outcome %v", res.Outcome)
	}
	p.Settled++
	err = r.j.Settle(ctx, op, StateDead, reason, 0)
	return errors.Join(err, x.Release(context.WithoutCancel(ctx)))
}

// answered settles an operation whose record the completer found
// completed: done if it was running (its last run stored its answer and
// ended before the journal's Finish); dead if it was waiting, for its
// last attempt failed: the answer is not the operation's (the handler
// that ran it stored one of its own instead of letting the key go), and
// its steps may be half done, which an operator must see.
func (r *Runner) answered(ctx context.Context, op Entry, p *Pass) error {
	p.Settled++
	if op.State == StateWaiting {
		return r.j.Settle(ctx, op, StateDead,
			"steps: the key was answered after a failed attempt, not by the operation: its steps may be half done ("+op.LastError+")", 0)
	}
	return r.j.Settle(ctx, op, StateDone, "", r.g.Config().Retention)
}

// Retry makes a dead (or waiting) operation due now: the completer
// resumes it at its next pass, with MaxAttempts attempts again.
func (r *Runner) Retry(ctx context.Context, scope, key string) error {
	return r.j.Retry(ctx, scope, key)
}

// Start starts the completer: a goroutine that runs Complete every
// Interval (with ±20 % jitter, so that instances spread out), and then
// sweeps up to Batch done operations whose retention (the Guard's) has
// ended, until Close. Every instance may run one: an operation is resumed by one
// execution at a time, the one that acquires its key.
func (r *Runner) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil {
		return errors.New("steps: the completer is started already")
	}
	r.stop, r.stopped = make(chan struct{}), make(chan struct{})
	go r.loop(r.stop, r.stopped)
	return nil
}

func (r *Runner) loop(stop, stopped chan struct{}) {
	defer close(stopped)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	for {
		d := time.Duration(float64(r.cfg.Interval) * (0.8 + 0.4*rand.Float64()))
		t := time.NewTimer(d)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		for {
			p, err := r.Complete(ctx)
			if err != nil && ctx.Err() == nil {
				r.cfg.Logger.WarnContext(ctx, "steps: completer: list the due operations", slog.Any(idem.LogErr, err))
			}
			// A full batch of some name: there may be more due now.
			if err != nil || p.Due < r.cfg.Batch || p.Finished+p.Failed+p.Settled == 0 || ctx.Err() != nil {
				break
			}
		}
		// Done operations past their retention go, a batch a pass.
		if _, err := r.j.Sweep(ctx, r.cfg.Batch); err != nil && ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "steps: completer: sweep", slog.Any(idem.LogErr, err))
		}
	}
}

// Close stops the completer, waiting for a pass that runs to end (its
// context is cancelled: a resumed operation's execution ends as a
// cancelled one does). It returns nil, also when the completer was not
// started.
func (r *Runner) Close() error {
	r.mu.Lock()
	stop, stopped := r.stop, r.stopped
	if stop != nil {
		// Under r.mu: two Closes at once must not both close it.
		select {
		case <-stop:
		default:
			close(stop)
		}
	}
	r.mu.Unlock()
	if stop == nil {
		return nil
	}
	<-stopped
	return nil
}
