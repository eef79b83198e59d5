package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
	idemsqlite "github.com/idemkit/idem/sqlstore/sqlite"
	"github.com/idemkit/idem/steps"
)

// afterRetry is a connector over modernc.org/sqlite that runs hook (once)
// when a read of idem_ops follows the execution of StepJournal.Retry's
// UPDATE on a connection.
type afterRetry struct {
	dsn   string
	mu    sync.Mutex
	armed bool
	hook  func()
}

func (c *afterRetry) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &retryConn{Conn: conn, c: c}, nil
}

func (c *afterRetry) Driver() driver.Driver { return &sqlite.Driver{} }

func (c *afterRetry) saw(query string) {
	c.mu.Lock()
	var hook func()
	switch {
	case strings.Contains(query, "UPDATE idem_ops SET attempts = CASE WHEN status = 'dead'"):
		c.armed = true
	case c.armed && strings.Contains(query, "FROM idem_ops"):
		c.armed, hook, c.hook = false, c.hook, nil
	}
	c.mu.Unlock()
	if hook != nil {
		hook()
	}
}

type retryConn struct {
	driver.Conn
	c *afterRetry
}

func (rc *retryConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := rc.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &retryStmt{Stmt: st, c: rc.c, query: query}, nil
}

func (rc *retryConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return rc.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (rc *retryConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := rc.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	rc.c.saw(query)
	return res, err
}

func (rc *retryConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rc.c.saw(query)
	return rc.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

type retryStmt struct {
	driver.Stmt
	c     *afterRetry
	query string
}

func (s *retryStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	res, err := s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	s.c.saw(s.query)
	return res, err
}

func (s *retryStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.saw(s.query)
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

// TestStepRetryReportsItsRetry: an operator's Retry of a dead operation
// whose attempt begins just after the Retry made it due (a client's
// retry, or the completer) did retry it: its attempts counted from 0
// again. Retry must say so, not that the operation is running and there
// was nothing to retry (idem retry and the operator page tell the
// operator "not retried").
func TestStepRetryReportsItsRetry(t *testing.T) {
	t.Parallel()
	conn := &afterRetry{dsn: idemsqlite.DSN(filepath.Join(t.TempDir(), "idem.db"))}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { _ = db.Close() })
	ctx := t.Context()
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := sqlstore.NewStepJournal(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	res, err := s.Acquire(ctx, idem.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatal(res.Outcome, err)
	}
	start := steps.Start{Name: "op", Fingerprint: "fp", Input: []byte("{}"), After: time.Hour}
	if _, err := j.Begin(ctx, res.Lease, start); err != nil {
		t.Fatal(err)
	}
	if st, err := j.Fail(ctx, res.Lease, steps.Failure{Reason: "down", MaxAttempts: 1}); err != nil || st != steps.StateDead {
		t.Fatal(st, err)
	}
	var hookErr error
	ran := false
	conn.hook = func() { ran = true; _, hookErr = j.Begin(ctx, res.Lease, start) }
	err = j.Retry(ctx, "", "k")
	// The window is Retry's own: a Retry that reads nothing after its
	// update has none, and the attempt does not begin.
	conn.mu.Lock()
	conn.armed, conn.hook = false, nil
	conn.mu.Unlock()
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	e, gerr := j.Get(ctx, "", "k")
	if gerr != nil {
		t.Fatal(gerr)
	}
	want, attempts := steps.StateWaiting, 0
	if ran {
		want, attempts = steps.StateRunning, 1
	}
	if e.State != want || e.Attempts != attempts {
		t.Fatalf("the operation after the Retry (an attempt began after it: %v): %s, %d attempts; want %s, %d", ran, e.State, e.Attempts, want, attempts)
	}
	if err != nil {
		t.Fatalf("Retry = %v, and it retried the operation (its attempts count from 0 again); want nil", err)
	}
}
