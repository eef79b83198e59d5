package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
)

// stepsStatements are the statements of StepJournal, in the block of
// queries/NAME.sql whose names start with "steps_".
type stepsStatements struct {
	fence, opLock, opInsert, opBegin, drop, checkpoints, save, fail, finish,
	settleDone, settleDead, due, postpone, get, list, retry, sweep *query
}

func (st *stepsStatements) byName() map[string]**query {
	return map[string]**query{
		"steps_fence":       &st.fence,
		"steps_op_lock":     &st.opLock,
		"steps_op_insert":   &st.opInsert,
		"steps_op_begin":    &st.opBegin,
		"steps_drop":        &st.drop,
		"steps_checkpoints": &st.checkpoints,
		"steps_save":        &st.save,
		"steps_fail":        &st.fail,
		"steps_finish":      &st.finish,
		"steps_settle_done": &st.settleDone,
		"steps_settle_dead": &st.settleDead,
		"steps_due":         &st.due,
		"steps_postpone":    &st.postpone,
		"steps_get":         &st.get,
		"steps_list":        &st.list,
		"steps_retry":       &st.retry,
		"steps_sweep":       &st.sweep,
	}
}

// The StepJournal's statements, as indexes into its statement cache.
const (
	stepsFence = iota
	stepsOpLock
	stepsOpInsert
	stepsOpBegin
	stepsDrop
	stepsCheckpoints
	stepsSave
	stepsFail
	stepsFinish
	stepsSettleDone
	stepsSettleDead
	stepsDue
	stepsPostpone
	stepsGet
	stepsList
	stepsRetry
	stepsSweep
	numStepsQueries
)

func (st *stepsStatements) query(i int) *query {
	return [...]*query{st.fence, st.opLock, st.opInsert, st.opBegin, st.drop, st.checkpoints, st.save, st.fail, st.finish,
		st.settleDone, st.settleDead, st.due, st.postpone, st.get, st.list, st.retry, st.sweep}[i]
}

// stepsAttempts bounds how often a transaction of StepJournal's own runs
// again after a deadlock or a serialisation failure.
const stepsAttempts = 8

// maxReason bounds the stored text of an attempt's error (bytes).
const maxReason = 2000

// storedReason is the text of an attempt's error as last_error keeps it
// (an operation's, a consume record's): at most limit bytes of UTF-8
// without NUL (PostgreSQL's text takes nothing else, and a Fail refused
// for its reason would leave the failure uncounted). Invalid bytes and
// NUL become U+FFFD; a cut never splits a character.
func storedReason(reason string, limit int) string {
	reason = strings.ReplaceAll(strings.ToValidUTF8(reason, "\uFFFD"), "\x00", "\uFFFD")
	if len(reason) <= limit {
		return reason
	}
	n := limit
	for n > 0 && !utf8.RuneStart(reason[n]) {
		n--
	}
	return reason[:n]
}

// StepJournal is a [steps.TxJournal] over database/sql: the operations of
// package steps and their checkpoints, in the tables idem_ops and
// idem_steps (created by Store.Migrate, or StepJournal.Migrate), next to
// the idempotency records that fence them. Use it with a Store on the
// same database: a local step's writes, its checkpoint and the check
// that the execution still holds its record commit in one transaction,
// and so do an operation's end and its record's completion.
//
// Every write for an execution first reads the record's row under a lock
// (SELECT … FOR UPDATE; on SQLite, the write transaction's lock) and
// goes on only if the execution's owner and fence hold it. The lock is
// kept until the transaction ends, so a takeover (which updates that
// row) either committed before, and the write is refused
// (idem.ErrLeaseLost), or waits until the write has committed, and the
// new execution's Begin reads its checkpoint. A local step takes the
// lock at its end, just before its checkpoint: its own writes run
// without holding the record, which the execution's watchdog goes on
// renewing.
//
// Times are the database's. Its transactions run at READ COMMITTED on
// PostgreSQL and MySQL, whatever the sessions' default; on SQLite they
// are write transactions (sqlite.Open's settings).
type StepJournal struct {
	db  *sql.DB
	d   Dialect
	cfg Config
	st  *stepsStatements
	statementSet
	cleanup runtime.Cleanup
}

var _ steps.TxJournal = (*StepJournal)(nil)

// NewStepJournal returns a StepJournal over db. cfg is required (for its
// Dialect) and is copied. It does not touch the database: run Migrate
// before first use.
func NewStepJournal(db *sql.DB, cfg *Config) (*StepJournal, error) {
	if db == nil {
		return nil, errors.New("sqlstore: NewStepJournal: nil *sql.DB")
	}
	if cfg == nil || cfg.Dialect == nil {
		return nil, errors.New("sqlstore: NewStepJournal: Config.Dialect is required (e.g. sqlstore.PostgreSQL)")
	}
	c := *cfg
	st := &c.Dialect.statements().steps
	j := &StepJournal{db: db, d: c.Dialect, cfg: c, st: st, statementSet: newStatementSet(db, c.Dialect, numStepsQueries, st.query)}
	j.cleanup = runtime.AddCleanup(j, (*stmtCache).close, j.cache)
	return j, nil
}

// Migrate applies the package's migrations, idem_ops and idem_steps among
// them (the same as Store.Migrate).
func (j *StepJournal) Migrate(ctx context.Context) error {
	st, err := New(j.db, &j.cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Migrate(ctx)
}

// Close closes the statements the StepJournal prepared on its *sql.DB
// (not the *sql.DB). Calls made after Close fail with ErrClosed. It is
// idempotent and returns nil.
func (j *StepJournal) Close() error {
	j.cleanup.Stop()
	j.cache.close()
	return nil
}

func (j *StepJournal) fail(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(err, idem.ErrLeaseLost), errors.Is(err, steps.ErrStepSaved), errors.Is(err, idem.ErrNotFound), errors.Is(err, steps.ErrNotRetryable):
		return err
	case errors.Is(err, idem.ErrMismatch):
		return fmt.Errorf("sqlstore: steps %s: %w", op, err)
	case j.cache.isClosed() && !errors.Is(err, ErrClosed):
		return fmt.Errorf("%w (steps %s: %v)", ErrClosed, op, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("sqlstore: steps %s: %w (%v)", op, cerr, err)
	}
	if j.d.missingTable(err) {
		return fmt.Errorf("sqlstore: steps %s: %w (has Migrate run?)", op, err)
	}
	return fmt.Errorf("sqlstore: steps %s: %w", op, err)
}

func (j *StepJournal) closedErr(op string) error {
	if j.cache.isClosed() {
		return fmt.Errorf("%w (steps %s)", ErrClosed, op)
	}
	return nil
}

// inTx runs f in a write transaction of the journal's own (READ
// COMMITTED), again after a deadlock or a serialisation failure.
func (j *StepJournal) inTx(ctx context.Context, op string, f func(tx *sql.Tx) error) error {
	if err := j.closedErr(op); err != nil {
		return err
	}
	var err error
	for attempt := 1; ; attempt++ {
		err = func() error {
			tx, err := j.d.beginWrite(ctx, j.db)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // a no-op after Commit
			if err := f(tx); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err == nil || !j.d.retryable(err) || attempt == stepsAttempts {
			break
		}
		if err := sleepCtx(ctx, time.Duration(attempt)*time.Millisecond); err != nil {
			break
		}
	}
	if err != nil {
		return j.fail(ctx, op, err)
	}
	return nil
}

// held checks, in tx, that l holds its record (processing; or completed
// by l when completed), and locks the record's row until tx ends.
func (j *StepJournal) held(ctx context.Context, tx *sql.Tx, l idem.Lease, completed bool) error {
	if err := validateLease(l); err != nil {
		return err
	}
	v := values{scope: l.Scope, key: l.Key, owner: l.Owner, fence: l.Fence}
	var status string
	err := j.queryRow(ctx, tx, stepsFence, &v, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idem.ErrLeaseLost
	case err != nil:
		return err
	case status == string(idem.StatusProcessing), completed && status == string(idem.StatusCompleted):
		return nil
	}
	return idem.ErrLeaseLost
}

// Begin implements steps.Journal.
func (j *StepJournal) Begin(ctx context.Context, l idem.Lease, s steps.Start) (steps.Resumed, error) {
	if s.Name == "" || len(s.Name) > 255 || len(s.Fingerprint) > 255 {
		return steps.Resumed{}, fmt.Errorf("sqlstore: steps begin: name %q, fingerprint of %d bytes: want 1–255 and at most 255", s.Name, len(s.Fingerprint))
	}
	var r steps.Resumed
	err := j.inTx(ctx, "begin", func(tx *sql.Tx) error {
		r = steps.Resumed{Checkpoints: map[string][]byte{}}
		if err := j.held(ctx, tx, l, false); err != nil {
			return err
		}
		v := values{scope: l.Scope, key: l.Key, name: s.Name, fingerprint: string(s.Fingerprint), input: s.Input, delayMS: s.After.Milliseconds()}
		if v.input == nil {
			v.input = []byte{}
		}
		var name, fp, status string
		var attempts int64
		err := j.queryRow(ctx, tx, stepsOpLock, &v, &name, &fp, &status, &attempts)
		if errors.Is(err, sql.ErrNoRows) {
			r.Attempt = 1
			_, err = j.exec(ctx, tx, stepsOpInsert, &v)
			return err
		}
		if err != nil {
			return err
		}
		if status != string(steps.StateDone) && (name != s.Name || fp != string(s.Fingerprint)) {
			// The key was released after a failed attempt and is reused
			// by another request: the operation is unfinished, its
			// steps may be half done, and it is not to be dropped.
			return fmt.Errorf("%w: the key's operation %q is %s, under another fingerprint", idem.ErrMismatch, name, status)
		}
		if status == string(steps.StateDone) {
			// This one again after its record expired, or another
			// operation under the key: from the start.
			if _, err := j.exec(ctx, tx, stepsDrop, &v); err != nil {
				return err
			}
			attempts = 0
		}
		v.attempts = attempts + 1
		r.Attempt = int(v.attempts)
		if _, err := j.exec(ctx, tx, stepsOpBegin, &v); err != nil {
			return err
		}
		return j.queryRows(ctx, tx, stepsCheckpoints, &v, func(rows *sql.Rows) error {
			var step string
			var result []byte
			var at int64
			if err := rows.Scan(&step, &result, &at); err != nil {
				return err
			}
			r.Checkpoints[step] = result
			return nil
		})
	})
	return r, err
}

// Save implements steps.Journal.
func (j *StepJournal) Save(ctx context.Context, l idem.Lease, step string, result []byte) error {
	return j.inTx(ctx, "save", func(tx *sql.Tx) error { return j.save(ctx, tx, l, step, result) })
}

// SaveTx implements steps.TxJournal.
func (j *StepJournal) SaveTx(ctx context.Context, tx *sql.Tx, l idem.Lease, step string, result []byte) error {
	if tx == nil {
		return errors.New("sqlstore: steps save in tx: nil *sql.Tx")
	}
	if err := j.closedErr("save"); err != nil {
		return err
	}
	if err := j.save(ctx, tx, l, step, result); err != nil {
		return j.fail(ctx, "save", err)
	}
	return nil
}

func (j *StepJournal) save(ctx context.Context, tx *sql.Tx, l idem.Lease, step string, result []byte) error {
	if step == "" || len(step) > 255 {
		return fmt.Errorf("sqlstore: steps save: step name %q: want 1–255 bytes", step)
	}
	if err := j.held(ctx, tx, l, false); err != nil {
		return err
	}
	v := values{scope: l.Scope, key: l.Key, step: step, result: result}
	res, err := j.exec(ctx, tx, stepsSave, &v)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: %q", steps.ErrStepSaved, step)
	}
	return nil
}

// Fail implements steps.Journal.
func (j *StepJournal) Fail(ctx context.Context, l idem.Lease, f steps.Failure) (steps.State, error) {
	reason := storedReason(f.Reason, maxReason)
	var state steps.State
	err := j.inTx(ctx, "fail", func(tx *sql.Tx) error {
		if err := j.held(ctx, tx, l, false); err != nil {
			return err
		}
		v := values{scope: l.Scope, key: l.Key, maxAttempts: int64(f.MaxAttempts), delayMS: f.Backoff.Milliseconds(), reason: reason}
		var name, fp, status string
		var attempts int64
		if err := j.queryRow(ctx, tx, stepsOpLock, &v, &name, &fp, &status, &attempts); err != nil {
			return err
		}
		if status != string(steps.StateRunning) {
			return fmt.Errorf("the operation is %s, not running", status)
		}
		if _, err := j.exec(ctx, tx, stepsFail, &v); err != nil {
			return err
		}
		state = steps.StateWaiting
		if attempts >= int64(f.MaxAttempts) {
			state = steps.StateDead
		}
		return nil
	})
	return state, err
}

// Finish implements steps.Journal.
func (j *StepJournal) Finish(ctx context.Context, l idem.Lease, retention time.Duration) error {
	return j.inTx(ctx, "finish", func(tx *sql.Tx) error { return j.finish(ctx, tx, l, retention) })
}

// FinishTx implements steps.TxJournal.
func (j *StepJournal) FinishTx(ctx context.Context, tx *sql.Tx, l idem.Lease, retention time.Duration) error {
	if tx == nil {
		return errors.New("sqlstore: steps finish in tx: nil *sql.Tx")
	}
	if err := j.closedErr("finish"); err != nil {
		return err
	}
	if err := j.finish(ctx, tx, l, retention); err != nil {
		return j.fail(ctx, "finish", err)
	}
	return nil
}

func (j *StepJournal) finish(ctx context.Context, tx *sql.Tx, l idem.Lease, retention time.Duration) error {
	if retention <= 0 {
		return fmt.Errorf("sqlstore: steps finish: retention must be positive, got %v", retention)
	}
	if err := j.held(ctx, tx, l, true); err != nil {
		return err
	}
	v := values{scope: l.Scope, key: l.Key, retentionMS: ceilMS(retention)}
	if _, err := j.exec(ctx, tx, stepsFinish, &v); err != nil {
		return err
	}
	_, err := j.exec(ctx, tx, stepsDrop, &v)
	return err
}

// BeginTx implements steps.TxJournal: a write transaction on the
// journal's database, at READ COMMITTED on PostgreSQL and MySQL.
func (j *StepJournal) BeginTx(ctx context.Context) (*sql.Tx, error) {
	if err := j.closedErr("begin tx"); err != nil {
		return nil, err
	}
	tx, err := j.d.beginWrite(ctx, j.db)
	if err != nil {
		return nil, j.fail(ctx, "begin tx", err)
	}
	return tx, nil
}

// DB returns the journal's database.
func (j *StepJournal) DB() *sql.DB { return j.db }

// Due implements steps.Journal.
func (j *StepJournal) Due(ctx context.Context, name string, limit int) ([]steps.Entry, error) {
	return j.entries(ctx, "due", stepsDue, &values{name: name, limit: int64(max(limit, 0))})
}

// List implements steps.Journal.
func (j *StepJournal) List(ctx context.Context, state steps.State, limit int) ([]steps.Entry, error) {
	return j.entries(ctx, "list", stepsList, &values{status: string(state), limit: int64(max(limit, 0))})
}

func (j *StepJournal) entries(ctx context.Context, op string, i int, v *values) ([]steps.Entry, error) {
	if err := j.closedErr(op); err != nil {
		return nil, err
	}
	var out []steps.Entry
	err := j.queryRows(ctx, nil, i, v, func(rows *sql.Rows) error {
		e, err := scanEntry(rows)
		out = append(out, e)
		return err
	})
	if err != nil {
		return nil, j.fail(ctx, op, err)
	}
	return out, nil
}

func scanEntry(row interface{ Scan(...any) error }) (steps.Entry, error) {
	var (
		e                                   steps.Entry
		fp, status                          string
		lastError                           []byte
		attempts                            int64
		nextAt, created, updated, expiresAt int64
	)
	if err := row.Scan(&e.Scope, &e.Key, &e.Name, &fp, &e.Input, &status, &attempts, &nextAt, &lastError, &created, &updated, &expiresAt); err != nil {
		return e, err
	}
	e.Fingerprint, e.State, e.Attempts, e.LastError = idem.Fingerprint(fp), steps.State(status), int(attempts), string(lastError)
	e.CreatedAt, e.UpdatedAt = fromMS(created), fromMS(updated)
	if nextAt != 0 {
		e.NextAt = fromMS(nextAt)
	}
	if expiresAt != 0 {
		e.ExpiresAt = fromMS(expiresAt)
	}
	return e, nil
}

// Get implements steps.Journal.
func (j *StepJournal) Get(ctx context.Context, scope, key string) (steps.Entry, error) {
	const op = "get"
	if err := j.closedErr(op); err != nil {
		return steps.Entry{}, err
	}
	if validateID(scope, key) != nil {
		// No record, so no operation, can have it (and PostgreSQL
		// refuses the bytes of some).
		return steps.Entry{}, idem.ErrNotFound
	}
	v := values{scope: scope, key: key}
	var e steps.Entry
	// One transaction: the operation and its checkpoints as of one
	// moment (a Finish drops the checkpoints as it marks it done).
	err := j.inTx(ctx, op, func(tx *sql.Tx) error {
		var err error
		e, err = scanEntry(j.rowOf(ctx, tx, stepsGet, &v))
		if errors.Is(err, sql.ErrNoRows) {
			return idem.ErrNotFound
		}
		if err != nil {
			return err
		}
		return j.queryRows(ctx, tx, stepsCheckpoints, &v, func(rows *sql.Rows) error {
			var c steps.Checkpoint
			var at int64
			if err := rows.Scan(&c.Step, &c.Result, &at); err != nil {
				return err
			}
			c.At = fromMS(at)
			e.Checkpoints = append(e.Checkpoints, c)
			return nil
		})
	})
	return e, err
}

// rowOf adapts queryRow to a Scan of its own.
func (j *StepJournal) rowOf(ctx context.Context, tx *sql.Tx, i int, v *values) scanFunc {
	return func(dest ...any) error { return j.queryRow(ctx, tx, i, v, dest...) }
}

type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }

// Postpone implements steps.Journal.
func (j *StepJournal) Postpone(ctx context.Context, scope, key string, d time.Duration) error {
	const op = "postpone"
	if err := j.closedErr(op); err != nil {
		return err
	}
	if _, err := j.exec(ctx, nil, stepsPostpone, &values{scope: scope, key: key, delayMS: d.Milliseconds()}); err != nil {
		return j.fail(ctx, op, err)
	}
	return nil
}

// Settle implements steps.Journal.
func (j *StepJournal) Settle(ctx context.Context, seen steps.Entry, state steps.State, reason string, retention time.Duration) error {
	reason = storedReason(reason, maxReason)
	v := values{scope: seen.Scope, key: seen.Key, fingerprint: string(seen.Fingerprint), status: string(seen.State), attempts: int64(seen.Attempts),
		reason: reason, retentionMS: ceilMS(retention)}
	switch state {
	case steps.StateDead:
		if err := j.closedErr("settle"); err != nil {
			return err
		}
		if _, err := j.exec(ctx, nil, stepsSettleDead, &v); err != nil {
			return j.fail(ctx, "settle", err)
		}
		return nil
	case steps.StateDone:
		if retention <= 0 {
			return fmt.Errorf("sqlstore: steps settle: retention must be positive, got %v", retention)
		}
		return j.inTx(ctx, "settle", func(tx *sql.Tx) error {
			var name, gotFP, status string
			var attempts int64
			err := j.queryRow(ctx, tx, stepsOpLock, &v, &name, &gotFP, &status, &attempts)
			if errors.Is(err, sql.ErrNoRows) || (err == nil && (gotFP != string(seen.Fingerprint) || status == string(steps.StateDone) ||
				status != string(seen.State) || attempts != int64(seen.Attempts))) {
				return nil
			}
			if err != nil {
				return err
			}
			if _, err := j.exec(ctx, tx, stepsSettleDone, &v); err != nil {
				return err
			}
			_, err = j.exec(ctx, tx, stepsDrop, &v)
			return err
		})
	}
	return fmt.Errorf("sqlstore: steps settle: state %q is neither done nor dead", state)
}

// Retry implements steps.Journal.
func (j *StepJournal) Retry(ctx context.Context, scope, key string) error {
	const op = "retry"
	if err := j.closedErr(op); err != nil {
		return err
	}
	if validateID(scope, key) != nil {
		return idem.ErrNotFound
	}
	v := values{scope: scope, key: key}
	// The operation is read under its row lock and updated in one
	// transaction: a read after the update could find an attempt that
	// began since (running) and report a retry made as refused.
	return j.inTx(ctx, op, func(tx *sql.Tx) error {
		var name, fp, status string
		var attempts int64
		err := j.queryRow(ctx, tx, stepsOpLock, &v, &name, &fp, &status, &attempts)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return idem.ErrNotFound
		case err != nil:
			return err
		case status != string(steps.StateDead) && status != string(steps.StateWaiting):
			return steps.ErrNotRetryable
		}
		_, err = j.exec(ctx, tx, stepsRetry, &v)
		return err
	})
}

// Sweep implements steps.Journal.
func (j *StepJournal) Sweep(ctx context.Context, limit int) (int, error) {
	const op = "sweep"
	if err := j.closedErr(op); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	var (
		res sql.Result
		err error
	)
	for attempt := 1; ; attempt++ {
		if res, err = j.exec(ctx, nil, stepsSweep, &values{limit: int64(limit)}); err == nil || !j.d.retryable(err) || attempt == stepsAttempts {
			break
		}
	}
	if err != nil {
		return 0, j.fail(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, j.fail(ctx, op, err)
	}
	return int(n), nil
}
