package storetest_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/storetest"
)

// TestRunTx runs the suite, CompleteTx cases included, against a memstore
// that completes inside a fake database's transactions: the completion
// happens when the transaction commits and not at all when it rolls back.
// It checks the suite itself; memstore's own test runs the rest.
func TestRunTx(t *testing.T) {
	db := sql.OpenDB(fakeConnector{})
	t.Cleanup(func() { _ = db.Close() })
	storetest.Run(t, func(t *testing.T) idem.Store {
		return &txStore{Store: memstore.New(nil)}
	}, storetest.Caps{
		BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Precision: time.Millisecond,
	})
}

// txStore is a memstore that implements idem.TxCompleter on the fake
// database.
type txStore struct{ *memstore.Store }

func (s *txStore) CompleteTx(ctx context.Context, tx *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration) error {
	rec, err := s.Get(ctx, l.Scope, l.Key)
	if err == nil && rec.Status == idem.StatusCompleted && rec.Owner == l.Owner && rec.Fence == l.Fence {
		return fmt.Errorf("%w: the completion committed already", idem.ErrFinished)
	}
	if errors.Is(err, idem.ErrNotFound) || err == nil && (rec.Status != idem.StatusProcessing || rec.Owner != l.Owner || rec.Fence != l.Fence) {
		return idem.ErrLeaseLost
	}
	if err != nil {
		return err
	}
	if retention <= 0 {
		return fmt.Errorf("retention %v", retention)
	}
	id := pending.add(func() error { return s.Complete(context.Background(), l, resp, retention) })
	_, err = tx.ExecContext(ctx, "complete", id)
	return err
}

// pending holds the operations transactions run on commit.
var pending = &operations{m: map[int64]func() error{}}

type operations struct {
	mu   sync.Mutex
	next atomic.Int64
	m    map[int64]func() error
}

func (o *operations) add(f func() error) int64 {
	id := o.next.Add(1)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.m[id] = f
	return id
}

func (o *operations) take(id int64) func() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	f := o.m[id]
	delete(o.m, id)
	return f
}

// The fake database: a transaction collects "complete" statements and runs
// them when it commits.
type fakeConnector struct{}

func (fakeConnector) Connect(context.Context) (driver.Conn, error) { return &fakeConn{}, nil }
func (fakeConnector) Driver() driver.Driver                        { return nil }

type fakeConn struct {
	tx *fakeTx
}

func (c *fakeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("fake: no prepare") }
func (c *fakeConn) Close() error                        { return nil }
func (c *fakeConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *fakeConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	c.tx = &fakeTx{c: c}
	return c.tx, nil
}

func (c *fakeConn) ExecContext(_ context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if query != "complete" || len(args) != 1 || c.tx == nil {
		return nil, fmt.Errorf("fake: cannot run %q outside a transaction", query)
	}
	c.tx.ops = append(c.tx.ops, args[0].Value.(int64))
	return driver.RowsAffected(1), nil
}

type fakeTx struct {
	c   *fakeConn
	ops []int64
}

func (tx *fakeTx) Commit() error {
	tx.c.tx = nil
	var errs []error
	for _, id := range tx.ops {
		errs = append(errs, pending.take(id)())
	}
	return errors.Join(errs...)
}

func (tx *fakeTx) Rollback() error {
	tx.c.tx = nil
	for _, id := range tx.ops {
		pending.take(id)
	}
	return nil
}
