package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
	idemsqlite "github.com/idemkit/idem/sqlstore/sqlite"
)

// errReadCut is what failingReads answers while it cuts reads.
var errReadCut = errors.New("test: the connection broke during the read")

// failingReads is a database/sql connector over modernc.org/sqlite that
// fails every query (not exec) reading idem_records while cut is set: a
// connection that broke just as a read was sent.
type failingReads struct {
	dsn string
	cut atomic.Bool
}

func (c *failingReads) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: conn, c: c}, nil
}

func (c *failingReads) Driver() driver.Driver { return &sqlite.Driver{} }

type cutConn struct {
	driver.Conn
	c *failingReads
}

func (cc *cutConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := cc.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &cutStmt{Stmt: st, c: cc.c, read: strings.HasPrefix(strings.TrimSpace(strings.ToUpper(query)), "SELECT") && strings.Contains(query, "idem_records")}, nil
}

func (cc *cutConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return cc.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (cc *cutConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return cc.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (cc *cutConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if cc.c.cut.Load() && strings.Contains(query, "idem_records") {
		return nil, errReadCut
	}
	return cc.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

type cutStmt struct {
	driver.Stmt
	c    *failingReads
	read bool
}

func (s *cutStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *cutStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if s.read && s.c.cut.Load() {
		return nil, errReadCut
	}
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

// TestCompleteReadBackFails: a completion that matches no row is
// followed by a read that says why (the lease completed the record
// already: nil; or the lease is lost). When that read fails, which of
// the two holds is unknown: Complete must report the failure, not
// ErrLeaseLost, a definite answer that would be false for a retry of a
// completion whose first reply was lost. The lincheck model found it on
// MariaDB under faults.
func TestCompleteReadBackFails(t *testing.T) {
	t.Parallel()
	conn := &failingReads{dsn: idemsqlite.DSN(filepath.Join(t.TempDir(), "idem.db"))}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire = %v, %v", res.Outcome, err)
	}
	resp := idem.Response{StatusCode: 201, Body: []byte("first")}
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	// The completion is retried (its reply was lost), and the read that
	// follows its empty match breaks.
	conn.cut.Store(true)
	err = s.Complete(ctx, res.Lease, resp, time.Hour)
	conn.cut.Store(false)
	if err == nil || errors.Is(err, idem.ErrLeaseLost) || !errors.Is(err, errReadCut) {
		t.Fatalf("retried Complete with its read cut = %v; want the read's error, not ErrLeaseLost", err)
	}
	// Once reads work, the retry finds its own completion.
	if err := s.Complete(ctx, res.Lease, resp, time.Hour); err != nil {
		t.Fatalf("retried Complete: %v", err)
	}
	rec, err := s.Get(ctx, "s", "k")
	if err != nil || rec.Status != idem.StatusCompleted || string(rec.Response.Body) != "first" {
		t.Fatalf("record = %+v, %v", rec, err)
	}
}
