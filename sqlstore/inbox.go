package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/idemkit/idem/inbox"
)

// inboxStatements are the statements of InboxStore, in the block of
// queries/NAME.sql whose names start with "inbox_".
type inboxStatements struct {
	insert, lock, update, finish, fail, extend, get, sweep, list, revive *query
}

func (st *inboxStatements) byName() map[string]**query {
	return map[string]**query{
		"inbox_insert": &st.insert,
		"inbox_lock":   &st.lock,
		"inbox_update": &st.update,
		"inbox_finish": &st.finish,
		"inbox_fail":   &st.fail,
		"inbox_extend": &st.extend,
		"inbox_get":    &st.get,
		"inbox_sweep":  &st.sweep,
		"inbox_list":   &st.list,
		"inbox_revive": &st.revive,
	}
}

// The InboxStore's statements, as indexes into its statement cache.
const (
	inboxInsert = iota
	inboxLock
	inboxUpdate
	inboxFinish
	inboxFail
	inboxExtend
	inboxGet
	inboxSweep
	inboxList
	inboxRevive
	numInboxQueries
)

func (st *inboxStatements) query(i int) *query {
	return [...]*query{st.insert, st.lock, st.update, st.finish, st.fail, st.extend, st.get, st.sweep, st.list, st.revive}[i]
}

// inboxAttempts bounds how often a claim runs again after a deadlock or
// a serialisation failure, or when the record changed between its
// statements.
const inboxAttempts = 8

// InboxStore is an [inbox.Store] and [inbox.TxStore] over database/sql:
// the consume records of package inbox, in the table idem_inbox (created
// by Store.Migrate, or InboxStore.Migrate). It is safe for concurrent
// use, also by several processes sharing the database.
//
// A claim of a new message is one statement (an insert that does nothing
// if the record exists). A claim of a known message reads its row under a
// row lock (SELECT … FOR UPDATE; on SQLite, the write transaction's lock)
// and, when it takes the record over, updates it: in the caller's
// transaction for ClaimTx, in a READ COMMITTED transaction of its own
// for Claim. Finish, Fail and Extend are one conditional UPDATE each, on
// the fence. Times are the database's. The statements outside the
// caller's transaction run at READ COMMITTED too, whatever the sessions'
// default (see ownStatements).
//
// ClaimTx is meant for a transaction at READ COMMITTED (the default of
// PostgreSQL; MySQL's REPEATABLE READ works too, since its locking reads
// see the latest row). At PostgreSQL's REPEATABLE READ or SERIALIZABLE it
// is as safe, but a delivery that meets a concurrent one's committed
// claim fails with a serialisation error (HandleTx: Retry, with the
// error) instead of waiting and answering Duplicate. On SQLite, begin
// the transaction with sqlite.Open's settings (IMMEDIATE).
type InboxStore struct {
	db  *sql.DB
	d   Dialect
	cfg Config // a copy of NewInboxStore's
	st  *inboxStatements
	statementSet
	cleanup runtime.Cleanup
}

var _ inbox.TxStore = (*InboxStore)(nil)

// NewInboxStore returns an InboxStore over db. cfg is required (for its
// Dialect) and is copied; its Logger receives the migrations Migrate
// applies. It does not touch the database: run Migrate before first use.
func NewInboxStore(db *sql.DB, cfg *Config) (*InboxStore, error) {
	if db == nil {
		return nil, errors.New("sqlstore: NewInboxStore: nil *sql.DB")
	}
	if cfg == nil || cfg.Dialect == nil {
		return nil, errors.New("sqlstore: NewInboxStore: Config.Dialect is required (e.g. sqlstore.PostgreSQL)")
	}
	c := *cfg
	st := &c.Dialect.statements().inbox
	s := &InboxStore{db: db, d: c.Dialect, cfg: c, st: st, statementSet: newStatementSet(db, c.Dialect, numInboxQueries, st.query)}
	s.cleanup = runtime.AddCleanup(s, (*stmtCache).close, s.cache)
	return s, nil
}

// Migrate applies the package's migrations, idem_inbox among them (the
// same as Store.Migrate), and prepares the InboxStore's statements.
func (s *InboxStore) Migrate(ctx context.Context) error {
	st, err := New(s.db, &s.cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	return s.Prepare(ctx)
}

// Prepare prepares the InboxStore's statements on its *sql.DB, which
// every call outside a transaction also does on first use. ClaimTx, in
// the caller's transaction, never prepares on the pool (the transaction
// may hold its only connection): before the statement is prepared, it
// sends the statement's text, which costs an extra round trip on MySQL.
// Migrate calls Prepare; call it at start-up when another program
// migrates the database.
func (s *InboxStore) Prepare(ctx context.Context) error {
	for i := range numInboxQueries {
		if _, err := s.cache.prepared(ctx, i, s.st.query(i).text); err != nil {
			return s.fail(ctx, "prepare", err)
		}
	}
	return nil
}

// Close closes the statements the InboxStore prepared on its *sql.DB
// (not the *sql.DB). Calls made after Close fail with ErrClosed. It is
// idempotent and returns nil.
func (s *InboxStore) Close() error {
	s.cleanup.Stop()
	s.cache.close()
	return nil
}

func (s *InboxStore) fail(ctx context.Context, op string, err error) error {
	if s.cache.isClosed() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w (inbox %s: %v)", ErrClosed, op, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("sqlstore: inbox %s: %w (%v)", op, cerr, err)
	}
	if s.d.missingTable(err) {
		return fmt.Errorf("sqlstore: inbox %s: %w (has Migrate run?)", op, err)
	}
	return fmt.Errorf("sqlstore: inbox %s: %w", op, err)
}

// Claim takes the record for a new attempt; see [inbox.Store]. A new
// message costs one statement; a known one a transaction of a locking
// read and, if the record changes, an update. A deadlock or a
// serialisation failure is retried.
func (s *InboxStore) Claim(ctx context.Context, group, id string, lease time.Duration, maxAttempts int) (inbox.Claim, error) {
	const op = "claim"
	if err := s.check(op, lease); err != nil {
		return inbox.Claim{}, err
	}
	var (
		c   inbox.Claim
		err error
	)
	for attempt := range inboxAttempts {
		c, err = s.claim(ctx, nil, group, id, lease, maxAttempts)
		if err == nil || !(s.d.retryable(err) || errors.Is(err, errVanished)) {
			break
		}
		if err := sleepCtx(ctx, time.Duration(attempt+1)*time.Millisecond); err != nil {
			return inbox.Claim{}, s.fail(ctx, op, err)
		}
	}
	if err != nil {
		return inbox.Claim{}, s.fail(ctx, op, err)
	}
	return c, nil
}

// ClaimTx claims the record in the caller's transaction tx for an effect
// that commits with it; see [inbox.TxStore]. The record's row stays
// locked until tx ends. A deadlock or a serialisation failure is
// returned (tx is then to be rolled back).
func (s *InboxStore) ClaimTx(ctx context.Context, tx *sql.Tx, group, id string, maxAttempts int) (inbox.Claim, error) {
	const op = "claim in tx"
	if tx == nil {
		return inbox.Claim{}, errors.New("sqlstore: inbox claim in tx: nil *sql.Tx")
	}
	if err := s.closedErr(op); err != nil {
		return inbox.Claim{}, err
	}
	c, err := s.claim(ctx, tx, group, id, 0, maxAttempts)
	if err != nil {
		return inbox.Claim{}, s.fail(ctx, op, err)
	}
	return c, nil
}

func (s *InboxStore) check(op string, lease time.Duration) error {
	if s.cache.isClosed() {
		return fmt.Errorf("%w (inbox %s)", ErrClosed, op)
	}
	if lease <= 0 {
		return fmt.Errorf("sqlstore: inbox %s: lease %v is not positive", op, lease)
	}
	return nil
}

// claim inserts a new record, or, in tx (a transaction of its own when tx
// is nil), locks the record and decides. A claim in the caller's tx
// (lease 0) writes the record succeeded: it commits with the effect.
func (s *InboxStore) claim(ctx context.Context, tx *sql.Tx, group, id string, lease time.Duration, maxAttempts int) (inbox.Claim, error) {
	v := values{messageID: id, group: group, status: string(inbox.StatusProcessing)}
	if lease > 0 {
		v.leaseMS = leaseMS(lease)
	} else {
		v.status = string(inbox.StatusSucceeded)
	}
	var now int64
	if s.d.completeReturns() {
		err := s.queryRow(ctx, tx, inboxInsert, &v, &now)
		if err == nil {
			return newClaim(now, &v), nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return inbox.Claim{}, err
		}
	} else {
		res, err := s.exec(ctx, tx, inboxInsert, &v)
		if err != nil {
			return inbox.Claim{}, err
		}
		// The insert id is the database's now for a new record, 0 for an
		// existing one (see queries/mysql.sql).
		if now, err = res.LastInsertId(); err != nil {
			return inbox.Claim{}, err
		}
		if now > 0 {
			return newClaim(now, &v), nil
		}
	}
	if tx != nil {
		return s.decide(ctx, tx, &v, maxAttempts)
	}
	// Claim's own transaction: READ COMMITTED whatever the sessions'
	// default (on PostgreSQL and MySQL; SQLite's as sqlite.Open sets it).
	tx, err := s.d.beginWrite(ctx, s.db)
	if err != nil {
		return inbox.Claim{}, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	c, err := s.decide(ctx, tx, &v, maxAttempts)
	if err != nil {
		return inbox.Claim{}, err
	}
	return c, tx.Commit()
}

func newClaim(now int64, v *values) inbox.Claim {
	return inbox.Claim{Claimed: true, Status: inbox.Status(v.status), Attempts: 1, Fence: 1, LeaseUntil: fromMS(now + v.leaseMS), Now: fromMS(now)}
}

// errVanished: the record was deleted (swept) between the insert that
// found it and the read.
var errVanished = errors.New("sqlstore: inbox record vanished during the claim")

// decide reads the record v under a row lock in tx and takes it over if
// it is failed or its lease has ended.
func (s *InboxStore) decide(ctx context.Context, tx *sql.Tx, v *values, maxAttempts int) (inbox.Claim, error) {
	var (
		status   string
		attempts int
		fence    int64
		until    int64
		now      int64
	)
	err := s.queryRow(ctx, tx, inboxLock, v, &status, &attempts, &fence, &until, &now)
	if errors.Is(err, sql.ErrNoRows) {
		// Swept after the insert saw it: a later delivery inserts anew.
		return inbox.Claim{}, errVanished
	}
	if err != nil {
		return inbox.Claim{}, err
	}
	c := inbox.Claim{Status: inbox.Status(status), Attempts: attempts, Fence: fence, LeaseUntil: fromMS(until), Now: fromMS(now)}
	expired := c.Status == inbox.StatusProcessing && until <= now
	if c.Status != inbox.StatusFailed && !expired {
		return c, nil
	}
	u := values{messageID: v.messageID, group: v.group, at: now}
	if expired && attempts >= maxAttempts {
		u.status, u.attempts, u.fence, u.leaseUntil = string(inbox.StatusDead), int64(attempts), fence, until
		c.Status = inbox.StatusDead
	} else {
		u.status, u.attempts, u.fence, u.leaseUntil = v.status, int64(attempts+1), fence+1, now+v.leaseMS
		c = inbox.Claim{Claimed: true, Status: inbox.Status(v.status), Attempts: attempts + 1, Fence: fence + 1, LeaseUntil: fromMS(u.leaseUntil), Now: c.Now}
	}
	if _, err := s.exec(ctx, tx, inboxUpdate, &u); err != nil {
		return inbox.Claim{}, err
	}
	return c, nil
}

// Finish marks the record succeeded; see [inbox.Store].
func (s *InboxStore) Finish(ctx context.Context, group, id string, fence int64) error {
	return s.finish(ctx, nil, group, id, fence)
}

// FinishTx is Finish in the caller's transaction tx; see [inbox.TxStore].
func (s *InboxStore) FinishTx(ctx context.Context, tx *sql.Tx, group, id string, fence int64) error {
	if tx == nil {
		return errors.New("sqlstore: inbox finish in tx: nil *sql.Tx")
	}
	return s.finish(ctx, tx, group, id, fence)
}

func (s *InboxStore) finish(ctx context.Context, tx *sql.Tx, group, id string, fence int64) error {
	const op = "finish"
	if err := s.closedErr(op); err != nil {
		return err
	}
	v := values{messageID: id, group: group, fence: fence}
	var (
		res sql.Result
		err error
	)
	for attempt := 1; ; attempt++ {
		if res, err = s.exec(ctx, tx, inboxFinish, &v); err == nil || tx != nil || !s.d.retryable(err) || attempt == inboxAttempts {
			break
		}
	}
	if err != nil {
		return s.fail(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if n == 0 {
		return inbox.ErrFenced
	}
	return nil
}

func (s *InboxStore) closedErr(op string) error {
	if s.cache.isClosed() {
		return fmt.Errorf("%w (inbox %s)", ErrClosed, op)
	}
	return nil
}

// Fail ends a failed attempt; see [inbox.Store].
func (s *InboxStore) Fail(ctx context.Context, group, id string, fence int64, maxAttempts int, reason string) (inbox.Status, error) {
	const op = "fail"
	if err := s.closedErr(op); err != nil {
		return "", err
	}
	reason = storedReason(reason, inbox.MaxReasonLen)
	v := values{messageID: id, group: group, fence: fence, maxAttempts: int64(maxAttempts), reason: reason}
	for attempt := 1; ; attempt++ {
		st, err := s.failOnce(ctx, &v)
		if err == nil || errors.Is(err, inbox.ErrFenced) {
			return st, err
		}
		if !s.d.retryable(err) || attempt == inboxAttempts {
			return "", s.fail(ctx, op, err)
		}
	}
}

func (s *InboxStore) failOnce(ctx context.Context, v *values) (inbox.Status, error) {
	if s.d.completeReturns() {
		var st string
		err := s.queryRow(ctx, nil, inboxFail, v, &st)
		if errors.Is(err, sql.ErrNoRows) {
			return "", inbox.ErrFenced
		}
		return inbox.Status(st), err
	}
	res, err := s.exec(ctx, nil, inboxFail, v)
	if err != nil {
		return "", err
	}
	if n, err := res.RowsAffected(); err != nil {
		return "", err
	} else if n == 0 {
		return "", inbox.ErrFenced
	}
	which, err := res.LastInsertId()
	if err != nil {
		return "", err
	}
	if which == 2 {
		return inbox.StatusDead, nil
	}
	return inbox.StatusFailed, nil
}

// Extend extends a live lease; see [inbox.Store].
func (s *InboxStore) Extend(ctx context.Context, group, id string, fence int64, lease time.Duration) error {
	const op = "extend"
	if err := s.check(op, lease); err != nil {
		return err
	}
	v := values{messageID: id, group: group, fence: fence, leaseMS: leaseMS(lease)}
	var (
		res sql.Result
		err error
	)
	for attempt := 1; ; attempt++ {
		if res, err = s.exec(ctx, nil, inboxExtend, &v); err == nil || !s.d.retryable(err) || attempt == inboxAttempts {
			break
		}
	}
	if err != nil {
		return s.fail(ctx, op, err)
	}
	var n int64
	if s.d.completeReturns() {
		n, err = res.RowsAffected()
	} else {
		n, err = res.LastInsertId()
	}
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if n == 0 {
		return inbox.ErrFenced
	}
	return nil
}

// Get returns the record; see [inbox.Store].
func (s *InboxStore) Get(ctx context.Context, group, id string) (inbox.Record, error) {
	const op = "get"
	if err := s.closedErr(op); err != nil {
		return inbox.Record{}, err
	}
	v := values{messageID: id, group: group}
	r := inbox.Record{Group: group, ID: id}
	var (
		status                  string
		until, created, updated int64
		lastError               []byte
	)
	err := s.queryRow(ctx, nil, inboxGet, &v, &status, &r.Attempts, &r.Fence, &until, &lastError, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return inbox.Record{}, inbox.ErrNotFound
	}
	if err != nil {
		return inbox.Record{}, s.fail(ctx, op, err)
	}
	r.Status, r.LastError = inbox.Status(status), string(lastError)
	r.LeaseUntil, r.CreatedAt, r.UpdatedAt = fromMS(until), fromMS(created), fromMS(updated)
	return r, nil
}

// Sweep removes up to limit succeeded, failed and dead records last
// updated more than retention ago and processing ones whose lease ended
// more than retention ago; see [inbox.Store]. On PostgreSQL it skips
// rows a transaction holds.
func (s *InboxStore) Sweep(ctx context.Context, retention time.Duration, limit int) (int, error) {
	const op = "sweep"
	if err := s.closedErr(op); err != nil {
		return 0, err
	}
	if limit <= 0 {
		limit = inbox.DefaultSweepLimit
	}
	v := values{retentionMS: ceilMS(retention), limit: int64(limit)}
	var (
		res sql.Result
		err error
	)
	for attempt := 1; ; attempt++ {
		if res, err = s.exec(ctx, nil, inboxSweep, &v); err == nil || !s.d.retryable(err) || attempt == inboxAttempts {
			break
		}
	}
	if err != nil {
		return 0, s.fail(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.fail(ctx, op, err)
	}
	return int(n), nil
}

// DefaultInboxListLimit is the number of records InboxStore.List returns
// when its limit is 0 or less.
const DefaultInboxListLimit = 100

// List returns the records of status (processing, succeeded, failed or
// dead), least recently updated first, at most limit of them (limit <= 0
// means DefaultInboxListLimit), of every consumer group. It is for
// operators (the operator page of shopd and idem proxy: stuck and dead
// messages): it walks the table in updated_at's order, which no index
// of status serves, so keep it off hot paths. A processing record's
// lease may have ended: its consumer died, and the next delivery takes
// it over.
func (s *InboxStore) List(ctx context.Context, status inbox.Status, limit int) ([]inbox.Record, error) {
	const op = "list"
	if err := s.closedErr(op); err != nil {
		return nil, err
	}
	switch status {
	case inbox.StatusProcessing, inbox.StatusSucceeded, inbox.StatusFailed, inbox.StatusDead:
	default:
		return nil, fmt.Errorf("sqlstore: inbox %s: unknown status %q", op, status)
	}
	if limit <= 0 {
		limit = DefaultInboxListLimit
	}
	v := values{status: string(status), limit: int64(limit)}
	var recs []inbox.Record
	err := s.run(ctx, nil, inboxList, &v, func(st *sql.Stmt, args []any) error {
		recs = recs[:0]
		rows, err := st.QueryContext(ctx, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				r                       inbox.Record
				st                      string
				until, created, updated int64
				lastError               []byte
			)
			if err := rows.Scan(&r.ID, &r.Group, &st, &r.Attempts, &r.Fence, &until, &lastError, &created, &updated); err != nil {
				return err
			}
			r.Status, r.LastError = inbox.Status(st), string(lastError)
			r.LeaseUntil, r.CreatedAt, r.UpdatedAt = fromMS(until), fromMS(created), fromMS(updated)
			recs = append(recs, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.fail(ctx, op, err)
	}
	return recs, nil
}

// Revive makes the dead record of (group, id) failed again, with no
// attempt counted (its fence, last error and creation time are kept), so
// that the next delivery of the message claims it and runs the handler
// again, for up to the inbox's MaxAttempts attempts more. It is an
// operator's action: the broker gave up on a dead message (dead-lettered
// it), so nothing delivers it again unless it is published again, with
// the same message ID. It returns an error wrapping inbox.ErrNotFound
// when there is no dead record of (group, id): none at all, or one in
// another status, which Revive leaves as it is.
func (s *InboxStore) Revive(ctx context.Context, group, id string) error {
	return s.revive(ctx, nil, group, id)
}

// ReviveTx is Revive in the caller's transaction tx: an operator's retry
// that also writes the message again (to an outbox) revives the record
// only if that write commits with it.
func (s *InboxStore) ReviveTx(ctx context.Context, tx *sql.Tx, group, id string) error {
	if tx == nil {
		return errors.New("sqlstore: inbox revive in tx: nil *sql.Tx")
	}
	return s.revive(ctx, tx, group, id)
}

func (s *InboxStore) revive(ctx context.Context, tx *sql.Tx, group, id string) error {
	const op = "revive"
	if err := s.closedErr(op); err != nil {
		return err
	}
	v := values{messageID: id, group: group}
	var (
		res sql.Result
		err error
	)
	for attempt := 1; ; attempt++ {
		if res, err = s.exec(ctx, tx, inboxRevive, &v); err == nil || tx != nil || !s.d.retryable(err) || attempt == inboxAttempts {
			break
		}
	}
	if err != nil {
		return s.fail(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlstore: inbox %s: no dead record of %q in group %q: %w", op, id, group, inbox.ErrNotFound)
	}
	return nil
}
