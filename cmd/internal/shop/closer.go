package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/sqlstore"
)

// The close job: orders unpaid for the pay timeout are closed (WAIT_PAY →
// CLOSED) and what they hold is given back. The timeout is counted on the
// database's clock (an order's created_ms and the pass's cutoff), so
// shopd processes whose clocks disagree agree on which orders expired. Every shopd runs the job; a
// pass works only in the instance that holds the job's lock (package
// lock, in the shop's database), and each of its close transactions
// presents the lease's fence to the row shop_jobs.'shop.close-unpaid'
// (UPDATE … WHERE last_fence <= fence): once a newer holder has written,
// an older one, paused past its lease, can no longer close anything. Each
// close is also a transition of the order machine with the version the job
// read, in one transaction with the give-back, so a second job, a late
// payment or a cancel racing the job never gives stock back twice and
// never closes a paid order: whoever moves the order first wins, and the
// loser's transition changes nothing.
//
// A pass also sweeps expired submit tokens, and the sent events and
// finished consume records older than CloserConfig.Retention, and reports
// each sweep to the shop's Config.Observer (idem.KindSweep; shopd's
// /metrics counts them in idem_swept_total).
//
// The lock is taken for one pass (TryAcquire) and released at its end,
// rather than held across passes: an instance that stops or hangs holds
// nothing between passes, any instance may run the next one, and the
// watchdog renews the lease only while a pass runs. The pass works under
// the lease's Context, so it stops when the lease is lost.

// Defaults and bounds of CloserConfig.
const (
	DefaultPayTimeout = 30 * time.Minute
	// MaxPayTimeout bounds -pay-timeout: a week.
	MaxPayTimeout     = 7 * 24 * time.Hour
	DefaultCloseBatch = 100
	// DefaultRetention is how long sent events and finished consume
	// records are kept: a week, longer than any redelivery (see
	// CloserConfig.Retention).
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultPassBudget bounds the time a pass spends closing orders and
	// sweeping (see CloserConfig.Budget).
	DefaultPassBudget = 20 * time.Second
	// sweepLimit bounds the rows one statement of a sweep deletes.
	sweepLimit       = 1000
	minCloseInterval = time.Second
	maxCloseInterval = time.Minute
	// releaseTimeout bounds the release of the lock after a pass.
	releaseTimeout = 5 * time.Second
)

// CloseJobName names the close job's lock (in idem_locks) and its fence
// row (in shop_jobs).
const CloseJobName = "shop.close-unpaid"

// CloserConfig configures a Closer. The zero value means the defaults.
type CloserConfig struct {
	// PayTimeout is how long an order may wait for its payment before the
	// job closes it. Default DefaultPayTimeout; at most MaxPayTimeout.
	PayTimeout time.Duration
	// Interval is the time between two passes. Default: a tenth of
	// PayTimeout, from 1 s to 1 min.
	Interval time.Duration
	// Batch bounds the orders one query of a pass finds and closes; a
	// pass repeats it until no expired order is left, or Budget is spent.
	// Default DefaultCloseBatch.
	Batch int
	// Budget bounds the time a pass spends: it closes expired orders, then
	// sweeps expired submit tokens, sent events and finished consume
	// records, each a batch at a time, and starts no new batch once Budget
	// has passed since the pass began, leaving the rest to the next pass.
	// Each of these parts runs at least one batch per pass, so a burst of
	// expired orders never starves the sweeps. Default DefaultPassBudget.
	Budget time.Duration
	// Retention is how long a sent event (a row of idem_outbox) and a
	// finished consume record (succeeded or dead, a row of idem_inbox)
	// are kept before a pass deletes them; on the database's clock, from
	// the row's sent_at or updated_at. Default DefaultRetention; negative:
	// never deleted. A consume record must outlive every redelivery of
	// its message: a duplicate delivered after its record went is handled
	// again. Sent events are kept for inspection only: the relay never
	// publishes a sent row again.
	Retention time.Duration
	// Lock is the lock a pass is taken under (CloseJobName): TryAcquire
	// returns a lease, or an error matching lock.ErrHeld when another
	// instance holds it (tests pass fakes of lock.Acquirer). Default: a
	// lock.Locker with lock's defaults (a 30 s lease, renewed by its
	// watchdog while a pass runs, held at most 10 min) over
	// sqlstore.NewLockBackend on the shop's database, whose table
	// idem_locks sqlstore's Migrate creates; the Closer closes it. Its
	// fences must come from the shop's database: the close transactions
	// compare them with shop_jobs.last_fence.
	Lock lock.Acquirer
}

// ErrFenced: a close transaction found a fence in shop_jobs higher than
// its lease's; a newer holder of the job's lock has worked, and this
// pass stopped without closing anything more.
var ErrFenced = errors.New("shop: the close job's fence is older than the last one written: a newer holder of its lock has worked")

// Closer runs the close job over a Shop's database until Close.
type Closer struct {
	s       *Shop
	cfg     CloserConfig
	backend *sqlstore.LockBackend // the default lock's, closed by Close
	inbox   *sqlstore.InboxStore  // swept; closed by Close
	stop    context.CancelFunc
	done    chan struct{}
	closed  sync.Once
	// beforeClose, when set (tests), runs in a pass before each close
	// transaction.
	beforeClose func(orderNo string)
}

// closeInterval derives the scan interval from the pay timeout.
func closeInterval(timeout time.Duration) time.Duration {
	return min(max(timeout/10, minCloseInterval), maxCloseInterval)
}

// NewCloser returns the close job over s's database; Start runs it.
func (s *Shop) NewCloser(cfg *CloserConfig) (*Closer, error) {
	c := CloserConfig{}
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.PayTimeout == 0:
		c.PayTimeout = DefaultPayTimeout
	case c.PayTimeout < 0 || c.PayTimeout > MaxPayTimeout:
		return nil, fmt.Errorf("shop: the pay timeout must be positive and at most %v", MaxPayTimeout)
	}
	switch {
	case c.Interval == 0:
		c.Interval = closeInterval(c.PayTimeout)
	case c.Interval < 0:
		return nil, errors.New("shop: the close job's interval must be positive")
	}
	switch {
	case c.Batch == 0:
		c.Batch = DefaultCloseBatch
	case c.Batch < 0:
		return nil, errors.New("shop: the close job's batch must be positive")
	}
	switch {
	case c.Budget == 0:
		c.Budget = DefaultPassBudget
	case c.Budget < 0:
		return nil, errors.New("shop: the close job's budget must be positive")
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	in, err := sqlstore.NewInboxStore(s.db, &sqlstore.Config{Dialect: s.dialect})
	if err != nil {
		return nil, err
	}
	closer := &Closer{s: s, cfg: c, inbox: in}
	if c.Lock == nil {
		b, err := sqlstore.NewLockBackend(s.db, &sqlstore.Config{Dialect: s.dialect})
		if err != nil {
			in.Close()
			return nil, err
		}
		l, err := lock.New(b, &lock.Config{Logger: s.log})
		if err != nil {
			b.Close()
			in.Close()
			return nil, err
		}
		closer.cfg.Lock, closer.backend = l, b
	}
	return closer, nil
}

// Start runs the job in a goroutine of the Closer's own, a pass every
// Interval, until Close.
func (c *Closer) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	c.stop, c.done = cancel, make(chan struct{})
	go func() {
		defer close(c.done)
		t := time.NewTicker(c.cfg.Interval)
		defer t.Stop()
		for {
			if _, err := c.RunOnce(ctx); err != nil && ctx.Err() == nil {
				c.s.log.WarnContext(ctx, "shop: close job pass failed", "error", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Close stops the job, waits for its pass in progress to end, and closes
// the default lock's backend. It is idempotent.
func (c *Closer) Close() error {
	c.closed.Do(func() {
		if c.stop != nil {
			c.stop()
			<-c.done
		}
		if c.backend != nil {
			c.backend.Close()
		}
		c.inbox.Close()
	})
	return nil
}

// RunOnce runs one pass: it takes the job's lock (and returns 0, nil when
// another instance holds it), closes the orders that have waited for
// their payment longer than PayTimeout, Batch at a time, sweeps expired
// submit tokens and the sent events and finished consume records older
// than Retention, sweepLimit rows at a time, each until none is left or
// Budget is spent (see CloserConfig.Budget), releases the lock, and
// returns how many orders it closed. It stops
// early, with an error, when the lease is lost (the cause is lock's) or a
// close transaction finds a newer fence (ErrFenced).
func (c *Closer) RunOnce(ctx context.Context) (int, error) {
	lease, err := c.cfg.Lock.TryAcquire(ctx, CloseJobName)
	if errors.Is(err, lock.ErrHeld) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("close job lock: %w", err)
	}
	defer func(parent context.Context) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(parent), releaseTimeout)
		defer cancel()
		_ = lease.Release(rctx) // a lost lease is not held: nothing to free
	}(ctx)
	ctx, cancel := lease.Context(ctx)
	defer cancel()
	fence := lease.Fence()
	deadline := time.Now().Add(c.cfg.Budget)
	closed, err := inBudget(ctx, deadline, func(ctx context.Context) (int, bool, error) {
		return c.closeBatch(ctx, fence)
	})
	if closed > 0 {
		c.s.log.InfoContext(ctx, "shop: closed unpaid orders", "closed", closed, "pay_timeout", c.cfg.PayTimeout, "fence", fence)
	}
	if err != nil {
		return closed, err
	}
	sweeps := []sweepPart{{"expired submit tokens", idem.SweepTokens, c.s.tokens.Sweep}}
	if c.cfg.Retention >= 0 {
		retained := func(sweep func(context.Context, time.Duration, int) (int, error)) func(context.Context, int) (int, error) {
			return func(ctx context.Context, limit int) (int, error) { return sweep(ctx, c.cfg.Retention, limit) }
		}
		sweeps = append(sweeps,
			sweepPart{"sent events", idem.SweepOutbox, retained(c.s.events.Sweep)},
			sweepPart{"finished consume records", idem.SweepInbox, retained(c.inbox.Sweep)})
	}
	for _, t := range sweeps {
		n, err := inBudget(ctx, deadline, func(ctx context.Context) (int, bool, error) {
			n, err := t.sweep(ctx, sweepLimit)
			return n, n < sweepLimit, err
		})
		c.reportSweep(ctx, t.op, n, err)
		if err != nil {
			return closed, fmt.Errorf("sweep %s: %w", t.what, stopCause(ctx, err))
		}
		if n > 0 {
			c.s.log.DebugContext(ctx, "shop: swept "+t.what, "swept", n, "retention", c.cfg.Retention)
		}
	}
	return closed, nil
}

// sweepPart is one sweep of a pass: what it deletes (for the log), its
// idem.Sweep* constant, and a statement deleting up to limit rows.
type sweepPart struct {
	what  string
	op    string
	sweep func(ctx context.Context, limit int) (int, error)
}

// closeBatch closes up to Batch orders that have waited for their payment
// longer than PayTimeout, and reports how many it closed and whether it
// is done: it found fewer than Batch, or closed none of those it found
// (they moved meanwhile; looking again would find them again).
func (c *Closer) closeBatch(ctx context.Context, fence int64) (int, bool, error) {
	rows, err := c.s.db.QueryContext(ctx, rebind(c.s.dialect, sqlExpiredOrders(c.s.dialect)), StatusWaitPay, c.cfg.PayTimeout.Milliseconds(), c.cfg.Batch)
	if err != nil {
		return 0, true, fmt.Errorf("find expired orders: %w", stopCause(ctx, err))
	}
	type candidate struct {
		orderNo string
		version int64
	}
	var todo []candidate
	for rows.Next() {
		var o candidate
		if err := rows.Scan(&o.orderNo, &o.version); err != nil {
			rows.Close()
			return 0, true, fmt.Errorf("find expired orders: %w", stopCause(ctx, err))
		}
		todo = append(todo, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, true, fmt.Errorf("find expired orders: %w", stopCause(ctx, err))
	}
	closed := 0
	for _, o := range todo {
		if c.beforeClose != nil {
			c.beforeClose(o.orderNo)
		}
		if ctx.Err() != nil {
			return closed, true, fmt.Errorf("close job stopped: %w", context.Cause(ctx)) // the lease was lost, or Close
		}
		ok, err := c.s.closeOrder(ctx, fence, o.orderNo, o.version)
		if err != nil {
			return closed, true, fmt.Errorf("close order %s: %w", o.orderNo, stopCause(ctx, err))
		}
		if ok {
			closed++
		}
	}
	return closed, len(todo) < c.cfg.Batch || closed == 0, nil
}

// reportSweep tells the shop's observer that a sweep of what (an
// idem.Sweep* constant) deleted n rows (an idem.KindSweep event; Store is
// the database's dialect, where the tables are, even when the records'
// store is tiered): after a success, and after a failure that deleted
// some rows in its earlier statements.
func (c *Closer) reportSweep(ctx context.Context, what string, n int, err error) {
	if c.s.observer == nil || (err != nil && n == 0) {
		return
	}
	c.s.observer.End(ctx, idem.Event{Kind: idem.KindSweep, Op: what, Store: c.s.dialect.String(), N: int64(n)})
}

// inBudget runs batch until it reports done, fails, or ctx ends, and
// starts no batch after deadline but the first: each part of a pass
// makes progress however long the earlier parts took. It returns the sum
// of the batches' counts.
func inBudget(ctx context.Context, deadline time.Time, batch func(context.Context) (n int, done bool, err error)) (int, error) {
	total := 0
	for {
		n, done, err := batch(ctx)
		total += n
		if err != nil || done {
			return total, err
		}
		if ctx.Err() != nil {
			return total, stopCause(ctx, ctx.Err())
		}
		if !time.Now().Before(deadline) {
			return total, nil
		}
	}
}

// stopCause adds to err why ctx ended (the lease lost, Close), if it did.
func stopCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// sqlExpiredOrders finds orders waiting for their payment for at least a
// timeout (in milliseconds) on the database's clock, on which their
// created_ms is written too, oldest first (the index
// shop_orders_status_created serves it). Orders of schema version 1 have
// created_ms 0 and count as expired.
func sqlExpiredOrders(d sqlstore.Dialect) string {
	return `SELECT order_no, version FROM shop_orders WHERE status = ? AND created_ms <= ` + dbNowMS(d) + ` - ? ORDER BY created_ms LIMIT ?`
}

// sqlFenceJob presents a pass's fence to the job's row: it succeeds (one
// row) while no newer fence was written, and refuses (0 rows) once a newer
// holder of the lock has written. fenced_writes changes the row every
// time, so MySQL counts it as affected.
const sqlFenceJob = `UPDATE shop_jobs SET last_fence = ?, fenced_writes = fenced_writes + 1 WHERE name = ? AND last_fence <= ?`

// closeOrder presents fence to the job's row and moves one order
// WAIT_PAY → CLOSED with the version the job read, and gives back what it
// holds, in one transaction. It reports whether it closed the order; an
// order that moved meanwhile (paid, cancelled, closed by another job) is
// left as it is. A newer fence in the job's row is ErrFenced, and nothing
// changes.
func (s *Shop) closeOrder(ctx context.Context, fence int64, orderNo string, version int64) (bool, error) {
	closed := false
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		closed = false
		res, err := tx.ExecContext(ctx, rebind(s.dialect, sqlFenceJob), fence, CloseJobName, fence)
		if err != nil {
			return fmt.Errorf("fence: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("fence: %w", err)
		} else if n == 0 {
			return ErrFenced
		}
		t, err := s.transitionOrder(ctx, tx, orderNo, trClose, version)
		var illegal *illegalTransitionError
		var conflict *conflictError
		switch {
		case errors.As(err, &illegal), errors.As(err, &conflict), errors.Is(err, errOrderNotFound):
			return nil
		case err != nil:
			return err
		case t.AlreadyApplied:
			return nil
		}
		if err := s.giveBack(ctx, tx, orderNo); err != nil {
			return err
		}
		if err := s.addEvent(ctx, tx, EventOrderClosed, orderNo); err != nil {
			return err
		}
		closed = true
		return nil
	})
	return closed, err
}
