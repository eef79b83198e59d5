package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"
)

// The close job: orders unpaid for the pay timeout are closed (WAIT_PAY →
// CLOSED) and what they hold is given back. Every shopd runs the job; the
// instance holding the job's lock works, the others wait for their turn.
// Each close is a transition of the order machine with the version the job
// read, in one transaction with the give-back, so a second job, a late
// payment or a cancel racing the job never gives stock back twice and
// never closes a paid order: whoever moves the order first wins, and the
// loser's transition changes nothing.

// Defaults and bounds of CloserConfig.
const (
	DefaultPayTimeout = 30 * time.Minute
	// MaxPayTimeout bounds -pay-timeout: a week.
	MaxPayTimeout       = 7 * 24 * time.Hour
	DefaultCloseBatch   = 100
	minCloseInterval    = time.Second
	maxCloseInterval    = time.Minute
	closeLockName       = "shop-close-unpaid"
	closeAttemptTimeout = 30 * time.Second
)

// CloserConfig configures a Closer. The zero value means the defaults.
type CloserConfig struct {
	// PayTimeout is how long an order may wait for its payment before the
	// job closes it. Default DefaultPayTimeout; at most MaxPayTimeout.
	PayTimeout time.Duration
	// Interval is the time between two passes. Default: a tenth of
	// PayTimeout, from 1 s to 1 min.
	Interval time.Duration
	// Batch bounds the orders one pass closes. Default DefaultCloseBatch.
	Batch int
	// Lock, when set, is taken for each pass: a pass runs only in the
	// instance that holds it (nil: every instance works, which the order
	// machine keeps correct, only wasteful).
	Lock JobLock
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// JobLock is the fenced lock the close job works under: TryAcquire
// returns a lease, or ErrJobLockHeld when another instance holds the
// lock. The lock package's Locker fits it through an adapter.
type JobLock interface {
	TryAcquire(ctx context.Context, name string) (JobLease, error)
}

// JobLease is a held JobLock.
type JobLease interface {
	// Fence is the lease's fencing token.
	Fence() int64
	// Context returns a context cancelled when the lease is lost.
	Context(parent context.Context) (context.Context, context.CancelFunc)
	Release(ctx context.Context) error
}

// ErrJobLockHeld: another instance holds the job's lock.
var ErrJobLockHeld = errors.New("shop: the close job's lock is held by another instance")

// Closer runs the close job over a Shop's database until Close.
type Closer struct {
	s      *Shop
	cfg    CloserConfig
	stop   context.CancelFunc
	done   chan struct{}
	closed sync.Once
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
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Closer{s: s, cfg: c}, nil
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

// Close stops the job and waits for its pass in progress to end.
func (c *Closer) Close() error {
	c.closed.Do(func() {
		if c.stop != nil {
			c.stop()
			<-c.done
		}
	})
	return nil
}

// RunOnce runs one pass: under the lock, when one is configured (and
// returns 0, nil when another instance holds it), it closes up to Batch
// orders that have waited for their payment longer than PayTimeout and
// returns how many it closed.
func (c *Closer) RunOnce(ctx context.Context) (int, error) {
	fence := int64(0)
	if c.cfg.Lock != nil {
		lease, err := c.cfg.Lock.TryAcquire(ctx, closeLockName)
		if errors.Is(err, ErrJobLockHeld) {
			return 0, nil
		} else if err != nil {
			return 0, fmt.Errorf("close job lock: %w", err)
		}
		defer lease.Release(context.WithoutCancel(ctx))
		var cancel context.CancelFunc
		ctx, cancel = lease.Context(ctx)
		defer cancel()
		fence = lease.Fence()
	}
	cutoff := c.cfg.Now().Add(-c.cfg.PayTimeout).UnixMilli()
	rows, err := c.s.db.QueryContext(ctx, rebind(c.s.dialect, sqlExpiredOrders), StatusWaitPay, cutoff, c.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("find expired orders: %w", err)
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
			return 0, fmt.Errorf("find expired orders: %w", err)
		}
		todo = append(todo, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("find expired orders: %w", err)
	}
	closed := 0
	for _, o := range todo {
		if ctx.Err() != nil {
			return closed, ctx.Err() // the lease was lost, or Close
		}
		ok, err := c.s.closeOrder(ctx, o.orderNo, o.version)
		if err != nil {
			return closed, fmt.Errorf("close order %s: %w", o.orderNo, err)
		}
		if ok {
			closed++
		}
	}
	if closed > 0 {
		c.s.log.InfoContext(ctx, "shop: closed unpaid orders", "closed", closed, "pay_timeout", c.cfg.PayTimeout, "fence", fence)
	}
	return closed, nil
}

// sqlExpiredOrders finds orders waiting for their payment since before a
// cutoff, oldest first (the index shop_orders_status_created serves it).
// Orders of schema version 1 have created_ms 0 and count as expired.
const sqlExpiredOrders = `SELECT order_no, version FROM shop_orders WHERE status = ? AND created_ms <= ? ORDER BY created_ms LIMIT ?`

// closeOrder moves one order WAIT_PAY → CLOSED with the version the job
// read, and gives back what it holds in that transaction. It reports
// whether it closed the order; an order that moved meanwhile (paid,
// cancelled, closed by another job) is left as it is.
func (s *Shop) closeOrder(ctx context.Context, orderNo string, version int64) (bool, error) {
	closed := false
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		closed = false
		t, err := s.transitionOrder(ctx, tx, orderNo, StatusClosed, version)
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
		closed = true
		return s.giveBack(ctx, tx, orderNo)
	})
	return closed, err
}
