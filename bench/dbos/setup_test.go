package dbosbench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"log/slog"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/steps"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// maxConns is the size of every pool (database/sql and pgxpool alike), as
// internal/testdb sizes its pools.
const maxConns = 8

// insertSQL is the unit of work: one row of a small business table.
const insertSQL = `INSERT INTO bench_effects (op, n) VALUES ($1, $2)`

// env is one database of the benchmark's own and everything that runs on
// it: a database/sql pool (raw, and idem's store), the pgx pool DBOS takes
// as its system database (dbos_step, and dbos_tx's data source), a second
// pgx pool on the same database (dbos_tx2's data source) and a launched
// DBOS context. Every connection counts the statements it sends in stmts.
type env struct {
	sqlDB    *sql.DB
	pool     *pgxpool.Pool // DBOS's system database pool
	appPool  *pgxpool.Pool // another pool on the same database
	dbos     dbos.Context
	shared   *dbos.DataSource // over pool: one transaction per step
	separate *dbos.DataSource // over appPool: two transactions per step
	stmts    *stmtCounter
	idem     func(tb testing.TB, n int) // runs an idem operation of n local steps
}

// setup creates a database of its own on the server at IDEM_POSTGRES_URL
// (dropped when tb ends), the business table, the pools and a DBOS context
// whose system tables live in that database's schema dbos. It skips tb (or
// fails it under IDEM_REQUIRE_SERVICES=1) when the server is unreachable.
func setup(tb testing.TB) *env {
	tb.Helper()
	ctx := context.Background()
	addr := testenv.Postgres.Need(tb)
	admin := testdb.Open(tb, "pgx", addr, testenv.Postgres)
	name := testdb.RandomName("idem_dbos_bench_")
	mustExec(tb, admin, "CREATE DATABASE "+name)
	// Registered before the pools' cleanups, so it runs after them; FORCE
	// ends any connection DBOS left behind.
	tb.Cleanup(func() {
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("DROP DATABASE %s: %v", name, err)
		}
	})
	u, err := url.Parse(addr)
	if err != nil {
		tb.Fatalf("%s: %v", testenv.Postgres.Var, err)
	}
	u.Path = "/" + name
	dsn := u.String()

	e := &env{stmts: &stmtCounter{}}
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	cc.Tracer = e.stmts
	e.sqlDB = stdlib.OpenDB(*cc)
	e.sqlDB.SetMaxOpenConns(maxConns)
	tb.Cleanup(func() { e.sqlDB.Close() })
	mustExec(tb, e.sqlDB, `CREATE TABLE bench_effects (id bigserial PRIMARY KEY, op text NOT NULL, n int NOT NULL)`)

	e.pool = newPool(tb, dsn, e.stmts)
	e.appPool = newPool(tb, dsn, e.stmts)
	tb.Cleanup(e.appPool.Close)

	e.dbos, err = dbos.NewContext(ctx, dbos.Config{
		AppName:      "idem-dbos-bench",
		SystemDBPool: e.pool, // DBOS closes it on Shutdown
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		e.pool.Close()
		tb.Fatalf("dbos.NewContext: %v", err)
	}
	tb.Cleanup(func() {
		if err := dbos.Shutdown(e.dbos, 10*time.Second); err != nil {
			tb.Errorf("dbos.Shutdown: %v", err)
		}
	})
	// The same pool as the system database: RunAsTransaction commits the
	// insert and the checkpoint in one transaction.
	if e.shared, err = dbos.NewDataSource(e.dbos, e.pool, dbos.WithDataSourceName("shared")); err != nil {
		tb.Fatalf("dbos.NewDataSource(system pool): %v", err)
	}
	// Another pool: DBOS treats it as another database, commits the insert
	// with a transaction_completion row, then checkpoints in the system
	// database.
	if e.separate, err = dbos.NewDataSource(e.dbos, e.appPool, dbos.WithDataSourceName("separate")); err != nil {
		tb.Fatalf("dbos.NewDataSource(other pool): %v", err)
	}
	dbos.RegisterWorkflow(e.dbos, e.stepWorkflow)
	dbos.RegisterWorkflow(e.dbos, e.txWorkflow)
	dbos.RegisterWorkflow(e.dbos, e.tx2Workflow)
	if err := dbos.Launch(e.dbos); err != nil {
		tb.Fatalf("dbos.Launch: %v", err)
	}
	e.idem = e.idemOp(tb)
	e.warmUp(tb)
	return e
}

// warmUp runs every variant once, so that no measured call dials a
// connection or prepares a statement for the first time.
func (e *env) warmUp(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	if err := e.insertSQLTx(ctx, "warmup", 0); err != nil {
		tb.Fatal(err)
	}
	if err := insertPgxTx(ctx, e.pool, "warmup", 0); err != nil {
		tb.Fatal(err)
	}
	for _, k := range e.kinds() {
		k.run(tb, 2)
	}
	if _, err := e.sqlDB.ExecContext(ctx, `DELETE FROM bench_effects`); err != nil {
		tb.Fatal(err)
	}
}

func newPool(tb testing.TB, dsn string, tracer pgx.QueryTracer) *pgxpool.Pool {
	tb.Helper()
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	pc.MaxConns = maxConns
	pc.ConnConfig.Tracer = tracer
	p, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// idemStore returns a store of idem's tables in e's database, migrated:
// what the idem side of the benchmark needs.
func (e *env) idemStore(tb testing.TB) *sqlstore.Store {
	tb.Helper()
	s, err := sqlstore.New(e.sqlDB, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		tb.Fatalf("sqlstore Migrate: %v", err)
	}
	return s
}

// idemOp returns a function that runs one idem operation of n local
// steps, each the insert (op "idem_step"), under a key of its own: the
// operation acquires its record, begins in the journal, runs its steps
// (each one transaction: the insert, the fence check and the checkpoint)
// and completes the record and ends the operation in one transaction.
func (e *env) idemOp(tb testing.TB) func(tb testing.TB, n int) {
	tb.Helper()
	store := e.idemStore(tb)
	j, err := sqlstore.NewStepJournal(e.sqlDB, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { j.Close() })
	g, err := idem.NewGuard(store, &idem.GuardConfig{Lease: 5 * time.Minute})
	if err != nil {
		tb.Fatal(err)
	}
	r, err := steps.New(g, j, nil)
	if err != nil {
		tb.Fatal(err)
	}
	var seq atomic.Int64
	run := rand.Text()
	op, err := steps.Define(r, "bench", func(ctx context.Context, s *steps.Run, n int) (int, error) {
		for i := range n {
			if _, err := steps.Local(s, "s"+strconv.Itoa(i), func(ctx context.Context, tx *sql.Tx) (int, error) {
				_, err := tx.ExecContext(ctx, insertSQL, "idem_step", i)
				return i, err
			}); err != nil {
				return 0, err
			}
		}
		return n, nil
	}, &steps.OpConfig[int, int]{
		Key: func(int) (string, string, error) { return "", run + "-" + strconv.FormatInt(seq.Add(1), 10), nil },
	})
	if err != nil {
		tb.Fatal(err)
	}
	return func(tb testing.TB, n int) {
		if got, _, err := op.Call(context.Background(), n); err != nil || got != n {
			tb.Fatalf("idem operation of %d steps: %d, %v", n, got, err)
		}
	}
}

// insertSQLTx is the raw unit of work over database/sql: BEGIN, INSERT,
// COMMIT.
func (e *env) insertSQLTx(ctx context.Context, op string, n int) error {
	tx, err := e.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, insertSQL, op, n); err != nil {
		return err
	}
	return tx.Commit()
}

// insertPgxTx is the same over pgxpool, the driver DBOS runs on.
func insertPgxTx(ctx context.Context, p *pgxpool.Pool, op string, n int) error {
	tx, err := p.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, insertSQL, op, n); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// stepWorkflow runs n DBOS steps (dbos.RunAsStep), each the raw insert in
// a transaction of its own on DBOS's pool.
func (e *env) stepWorkflow(ctx dbos.Context, n int) (int, error) {
	for i := range n {
		if _, err := dbos.RunAsStep(ctx, func(ctx context.Context) (int, error) {
			return i, insertPgxTx(ctx, e.pool, "dbos_step", i)
		}, dbos.WithStepName("insert")); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// txWorkflow runs n DBOS transactions (dbos.RunAsTransaction) on the data
// source over the system database's own pool.
func (e *env) txWorkflow(ctx dbos.Context, n int) (int, error) {
	return runTx(ctx, e.shared, "dbos_tx", n)
}

// tx2Workflow runs n DBOS transactions on the data source over another
// pool.
func (e *env) tx2Workflow(ctx dbos.Context, n int) (int, error) {
	return runTx(ctx, e.separate, "dbos_tx2", n)
}

func runTx(ctx dbos.Context, ds *dbos.DataSource, op string, n int) (int, error) {
	for i := range n {
		if _, err := dbos.RunAsTransaction(ctx, ds, func(ctx context.Context, tx dbos.Tx) (int, error) {
			_, err := tx.Exec(ctx, insertSQL, op, i)
			return i, err
		}, dbos.WithStepName("insert")); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// run runs the workflow wf of n steps to its end.
func (e *env) run(tb testing.TB, wf dbos.Workflow[int, int], n int) {
	h, err := dbos.RunWorkflow(e.dbos, wf, n)
	if err != nil {
		tb.Fatal(err)
	}
	if got, err := h.GetResult(); err != nil || got != n {
		tb.Fatalf("workflow of %d steps: %d, %v", n, got, err)
	}
}

// stmtCounter is a pgx tracer that counts the statements the connections
// send (BEGIN and COMMIT included: pgx sends them as statements), and
// records their text while recording is on.
type stmtCounter struct {
	n         atomic.Int64
	recording atomic.Bool
	mu        sync.Mutex
	sql       []string
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	if c.recording.Load() {
		c.mu.Lock()
		c.sql = append(c.sql, data.SQL)
		c.mu.Unlock()
	}
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// record turns recording on, runs f and returns the statements sent
// meanwhile.
func (c *stmtCounter) record(f func()) []string {
	c.mu.Lock()
	c.sql = nil
	c.mu.Unlock()
	c.recording.Store(true)
	f()
	c.recording.Store(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sql
}

func mustExec(tb testing.TB, db *sql.DB, stmt string) {
	tb.Helper()
	if _, err := db.ExecContext(context.Background(), stmt); err != nil {
		tb.Fatalf("%s: %v", stmt, err)
	}
}
