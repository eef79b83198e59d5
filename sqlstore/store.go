package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/idemkit/idem"
)

// Config configures a Store.
type Config struct {
	// Dialect is the database's SQL flavour. Required.
	Dialect Dialect
	// Logger receives migrations applied and leases taken over. Nil
	// discards. A line identifies a key by its hash (idem.key_hash) only.
	Logger *slog.Logger
}

// Store is an [idem.Store], [idem.TxCompleter] and
// [idem.ConditionalDeleter] over database/sql. It is
// safe for concurrent use, also by several processes sharing the
// database. Create it with New and create its tables with Migrate; Close
// it when done.
type Store struct {
	db      *sql.DB
	d       Dialect
	st      *statements
	log     *slog.Logger
	cache   *stmtCache
	cleanup runtime.Cleanup
	// own runs the Store's own statements (outside a caller's
	// transaction): alone, or in READ COMMITTED transactions of their own
	// (see run).
	own *ownStatements
}

// ErrClosed is returned by every method of a Store after Close.
var ErrClosed = errors.New("sqlstore: store closed")

var (
	_ idem.Store              = (*Store)(nil)
	_ idem.TxCompleter        = (*Store)(nil)
	_ idem.ConditionalDeleter = (*Store)(nil)
)

// New returns a Store over db. cfg is required (for its Dialect) and is
// copied. New does not touch the database: call Migrate before first use.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: New: nil *sql.DB")
	}
	if cfg == nil || cfg.Dialect == nil {
		return nil, errors.New("sqlstore: New: Config.Dialect is required (e.g. sqlstore.SQLite)")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{db: db, d: cfg.Dialect, st: cfg.Dialect.statements(), log: log, cache: newStmtCache(db, numQueries)}
	s.own = newOwnStatements(db, cfg.Dialect, s.cache)
	// A Store that is never closed closes its statements once it is
	// garbage.
	s.cleanup = runtime.AddCleanup(s, (*stmtCache).close, s.cache)
	return s, nil
}

// Close closes the statements the Store prepared on its *sql.DB, on every
// connection that holds them. It does not close the *sql.DB, which is the
// caller's. Every call made after Close returns fails with an error
// matching [ErrClosed] and sends nothing to the database; a call running
// while Close runs either completes or fails with ErrClosed. Close is
// idempotent and returns nil. (A Store dropped without Close closes its
// statements when it is garbage collected, at a time the program does not
// control.)
func (s *Store) Close() error {
	s.cleanup.Stop()
	s.cache.close()
	return nil
}

// closed returns the error of a call op made after Close, or nil.
func (s *Store) closed(op string) error {
	if s.cache.isClosed() {
		return fmt.Errorf("%w (%s)", ErrClosed, op)
	}
	return nil
}

// prepared returns q prepared on the Store's database, preparing it on
// first use (see stmtCache.prepared: never while holding a transaction).
func (s *Store) prepared(ctx context.Context, q *query) (*sql.Stmt, error) {
	return s.cache.prepared(ctx, q.id, q.text)
}

// run runs f on q prepared, bound to tx when tx is not nil (see
// stmtCache.run, which also serves a transaction of another *sql.DB).
// Inside a transaction it uses the cached statement if there is one, and
// otherwise prepares q on tx's own connection: it never waits for a
// second connection while tx holds the first.
//
// Outside a transaction (tx nil), q runs on its own, under autocommit,
// unless the sessions of the Store's database default to an isolation
// level above READ COMMITTED: q then runs in a transaction of its own
// begun at READ COMMITTED (see ownStatements).
func (s *Store) run(ctx context.Context, tx *sql.Tx, q *query, f func(st *sql.Stmt) error) error {
	if tx == nil {
		return s.own.run(ctx, q.id, q.text, f)
	}
	return runInTx(ctx, s.cache, tx, q.id, q.text, f)
}

func (s *Store) exec(ctx context.Context, tx *sql.Tx, q *query, v *values) (sql.Result, error) {
	var res sql.Result
	err := s.run(ctx, tx, q, func(st *sql.Stmt) (err error) {
		res, err = st.ExecContext(ctx, q.args(v)...)
		return err
	})
	return res, err
}

// queryRow runs q and scans its one row into dest; sql.ErrNoRows if none.
func (s *Store) queryRow(ctx context.Context, tx *sql.Tx, q *query, v *values, dest ...any) error {
	return s.run(ctx, tx, q, func(st *sql.Stmt) error {
		return st.QueryRowContext(ctx, q.args(v)...).Scan(dest...)
	})
}

// Acquire claims the lease on (req.Scope, req.Key); see [idem.Store]. A
// replay, a duplicate in flight or a mismatch costs one read. The
// package documentation says what a new, expired or taken-over key costs
// on each dialect.
func (s *Store) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	const op = "acquire"
	if err := s.closed(op); err != nil {
		return idem.AcquireResult{}, err
	}
	if err := req.Validate(); err != nil {
		return idem.AcquireResult{}, fmt.Errorf("sqlstore: %s: %w", op, err)
	}
	v := values{
		scope:       req.Scope,
		key:         req.Key,
		fingerprint: string(req.Fingerprint),
		owner:       idem.NewOwner(),
		leaseMS:     ceilMS(req.Lease),
		retentionMS: ceilMS(req.Retention),
	}
	var (
		res idem.AcquireResult
		err error
	)
	switch s.d.acquireMode() {
	case acquireOneStatement:
		res, err = s.acquireOneStatement(ctx, req, &v)
	case acquireUpsertRead:
		res, err = s.acquireUpsertRead(ctx, req, &v)
	default:
		res, err = s.acquireInTx(ctx, req, &v)
	}
	if err != nil {
		return idem.AcquireResult{}, s.fail(ctx, op, err)
	}
	if res.TookOver {
		s.log.InfoContext(ctx, "sqlstore: took over an expired lease", idem.LogKey(req.Scope, req.Key, false), slog.Int64(idem.LogFence, res.Lease.Fence))
	}
	return res, nil
}

// maxAcquireAttempts bounds the rounds of Acquire that end in a deadlock,
// a serialisation failure, or a record that changed between two
// statements. Each such round means another caller made progress on the
// key; a handful is never reached in practice.
const maxAcquireAttempts = 8

// acquired is the Acquired result for the lease v.owner now holds, with
// the record every dialect's acquire statement writes: lease_until = now +
// lease_ms and expires_at = lease_until + retention_ms. leaseUntil -
// leaseMS is the database's now at the write: a new record, or one that
// replaced an expired record, is created then, and a takeover keeps the
// older created_at (the fingerprint is the request's in every case: a
// takeover requires it). tookOver says that the record replaced was
// processing.
func acquired(req idem.AcquireRequest, v *values, fence, leaseUntil, createdAt int64, tookOver bool) idem.AcquireResult {
	until := fromMS(leaseUntil)
	return idem.AcquireResult{
		Outcome: idem.Acquired,
		Lease: idem.Lease{
			Scope: req.Scope, Key: req.Key, Owner: v.owner, Fence: fence,
			Until: until,
		},
		Record: idem.Record{
			Scope:       req.Scope,
			Key:         req.Key,
			Fingerprint: req.Fingerprint,
			Status:      idem.StatusProcessing,
			Owner:       v.owner,
			Fence:       fence,
			LeaseUntil:  until,
			Retention:   time.Duration(v.retentionMS) * time.Millisecond,
			CreatedAt:   fromMS(createdAt),
			ExpiresAt:   fromMS(leaseUntil + v.retentionMS),
		},
		TookOver: tookOver,
	}
}

// acquireInTx: select_held; then, in one write transaction, the upsert
// and, if it took nothing, the record it met (SQLite).
func (s *Store) acquireInTx(ctx context.Context, req idem.AcquireRequest, v *values) (idem.AcquireResult, error) {
	// A replay, a duplicate in flight or a mismatch is answered by a read:
	// such a record changes only when its lease or retention ends.
	switch rec, err := s.scanRecord(ctx, nil, s.st.selectHeld, v); {
	case err == nil:
		return held(req, rec), nil
	case !errors.Is(err, idem.ErrNotFound):
		return idem.AcquireResult{}, err
	}

	// Prepare both statements before the transaction takes its connection.
	for _, q := range []*query{s.st.acquire, s.st.selectRecord} {
		if _, err := s.prepared(ctx, q); err != nil {
			return idem.AcquireResult{}, err
		}
	}
	tx, err := s.d.beginWrite(ctx, s.db)
	if err != nil {
		return idem.AcquireResult{}, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	var fence, leaseUntil, createdAt int64
	var tookOver bool
	err = s.queryRow(ctx, tx, s.st.acquire, v, &fence, &leaseUntil, &createdAt, &tookOver)
	switch {
	case err == nil:
		if err := tx.Commit(); err != nil {
			return idem.AcquireResult{}, err
		}
		return acquired(req, v, fence, leaseUntil, createdAt, tookOver), nil
	case !errors.Is(err, sql.ErrNoRows):
		return idem.AcquireResult{}, err
	}

	// The record exists and is not ours to take: report it. The write
	// transaction still holds it, so it is the record the insert saw.
	rec, err := s.get(ctx, tx, req.Scope, req.Key)
	if err != nil {
		if errors.Is(err, idem.ErrNotFound) {
			err = errors.New("record vanished inside the transaction")
		}
		return idem.AcquireResult{}, err
	}
	return held(req, rec), nil
}

// acquireOneStatement: one statement reads the held record or takes the
// key (PostgreSQL). It returns no row only when the record its write met
// vanished before it could be read; the round then starts over.
func (s *Store) acquireOneStatement(ctx context.Context, req idem.AcquireRequest, v *values) (idem.AcquireResult, error) {
	var err error
	for attempt := range maxAcquireAttempts {
		if attempt > 0 && s.d.retryable(err) {
			// A deadlock, or a serialisation failure (not expected: the
			// statement runs at READ COMMITTED whatever the sessions'
			// default, see ownStatements): let the other caller commit,
			// and do not all come back at once. Each attempt is a
			// statement, and a transaction, of its own: it has a new
			// snapshot.
			if err := sleepCtx(ctx, time.Duration(attempt)*time.Millisecond+rand.N(time.Millisecond<<attempt)); err != nil {
				return idem.AcquireResult{}, err
			}
		}
		var rec idem.Record
		var tookOver bool
		rec, err = s.scanRecord(ctx, nil, s.st.acquire, v, &tookOver)
		switch {
		case err == nil && rec.Owner == v.owner && rec.Status == idem.StatusProcessing:
			return acquired(req, v, rec.Fence, rec.LeaseUntil.UnixMilli(), rec.CreatedAt.UnixMilli(), tookOver), nil
		case err == nil:
			return held(req, rec), nil
		case errors.Is(err, idem.ErrNotFound), s.d.retryable(err):
		default:
			return idem.AcquireResult{}, err
		}
	}
	return idem.AcquireResult{}, fmt.Errorf("key still contended after %d attempts: %w", maxAcquireAttempts, err)
}

// acquireUpsertRead: select_held; then the upsert (MySQL). A new key
// costs these two statements: the upsert reports the database's now as
// its insert id (LAST_INSERT_ID(now) among the values it inserts), and a
// record it inserted has fence 1, a lease from now, and v.owner. The
// update branch sets the insert id to mysqlTookProcessing,
// mysqlReplaced or 0 instead. Anything but an insert (the upsert
// replaced or took over a record, or met one it could not take) reads
// the record back with select_record: the upsert took the key if and
// only if that record carries v.owner, a random token no other caller
// has; it then holds the fence and lease the upsert wrote, since nobody
// but v.owner changes a record under a live lease (Delete aside, after
// which the round starts over). Another owner means the upsert found a
// record it could not take, as of the moment it ran.
func (s *Store) acquireUpsertRead(ctx context.Context, req idem.AcquireRequest, v *values) (idem.AcquireResult, error) {
	switch rec, err := s.scanRecord(ctx, nil, s.st.selectHeld, v); {
	case err == nil:
		return held(req, rec), nil
	case !errors.Is(err, idem.ErrNotFound):
		return idem.AcquireResult{}, err
	}
	var err error
	for attempt := range maxAcquireAttempts {
		var res sql.Result
		if res, err = s.exec(ctx, nil, s.st.acquire, v); err != nil {
			if !s.d.retryable(err) {
				return idem.AcquireResult{}, err
			}
			// InnoDB rolled the upsert back: its gap and insert-intention
			// locks met another caller's. Let that caller finish.
			if err := sleepCtx(ctx, time.Duration(attempt+1)*time.Millisecond); err != nil {
				return idem.AcquireResult{}, err
			}
			continue
		}
		// The insert id: the database's now after an insert, or what the
		// update branch did. A driver that does not report it (ierr !=
		// nil) takes the read below: slower, as correct, but TookOver then
		// misses the replacement of an abandoned record.
		id, ierr := res.LastInsertId()
		if ierr == nil && id > mysqlReplaced {
			if n, rerr := res.RowsAffected(); rerr == nil && n == 1 {
				return acquired(req, v, 1, id+v.leaseMS, id, false), nil
			}
		}
		var rec idem.Record
		rec, err = s.get(ctx, nil, req.Scope, req.Key)
		switch {
		case err == nil && rec.Owner == v.owner && rec.Status == idem.StatusProcessing:
			tookOver := ierr == nil && id == mysqlTookProcessing
			return acquired(req, v, rec.Fence, rec.LeaseUntil.UnixMilli(), rec.CreatedAt.UnixMilli(), tookOver), nil
		case err == nil:
			return held(req, rec), nil
		case !errors.Is(err, idem.ErrNotFound):
			return idem.AcquireResult{}, err
		}
	}
	return idem.AcquireResult{}, fmt.Errorf("key still contended after %d attempts: %w", maxAcquireAttempts, err)
}

// again runs f, a statement on its own (autocommit), and runs it again,
// at most maxAcquireAttempts times in all, while it fails with a deadlock
// or a serialisation failure. Such a failure rolled the statement back,
// so it may simply run again, with a new snapshot: on PostgreSQL, when
// the sessions default to REPEATABLE READ or SERIALIZABLE, a write that
// waited for a concurrent change of its row (a takeover, say) fails so
// once that change commits, and the next run sees the change
// (TestPostgresDefaultIsolationWrites).
func (s *Store) again(ctx context.Context, f func() error) error {
	var err error
	for attempt := range maxAcquireAttempts {
		if err = f(); err == nil || !s.d.retryable(err) {
			return err
		}
		if err := sleepCtx(ctx, time.Duration(attempt)*time.Millisecond); err != nil {
			return err
		}
	}
	return err
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// held is the answer of Acquire about a record it cannot take.
func held(req idem.AcquireRequest, rec idem.Record) idem.AcquireResult {
	res := idem.AcquireResult{Record: rec}
	switch {
	case rec.Fingerprint != req.Fingerprint:
		res.Outcome = idem.Mismatch
	case rec.Status == idem.StatusCompleted:
		res.Outcome = idem.Completed
	default:
		res.Outcome = idem.InFlight
	}
	return res
}

// Complete stores resp and marks the record completed, kept for
// retention; see [idem.Store]. It errs with [idem.ErrLeaseLost] unless the
// record is processing under l's owner and fence, or already completed
// under them: then Complete is the retry of a completion that committed
// (its reply lost, say), and it returns nil and leaves the stored
// response as it is.
func (s *Store) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	return s.complete(ctx, "complete", nil, l, resp, retention, nil)
}

// CompleteTx is Complete run in tx, the caller's transaction on the same
// database, so that the business effect and the stored response commit
// together or not at all; see [idem.TxCompleter]. tx may belong to the
// Store's *sql.DB or to any other *sql.DB open on the same database: the
// Store's cached statements serve the first, and a statement prepared on
// tx's connection the second. The record stays locked
// until tx ends (on SQLite, the whole database: tx holds the write lock,
// and under sqlite.Open the only connection, so every other write waits).
// Begin tx IMMEDIATE on SQLite ([github.com/idemkit/idem/sqlstore/sqlite.Open] does), or a read in tx
// before CompleteTx may make the completion fail with "database is
// locked" when another process wrote in between.
//
// When the completion matches nothing, CompleteTx reads the record in tx,
// never on another connection, which would wait until ctx ends when tx
// holds the last connection of the Store's pool.
//
// Unlike Complete, CompleteTx on a record that l completed already fails,
// with an error matching [idem.ErrFinished]: the completion committed
// before, with its effect, and tx must roll back rather than commit the
// effect a second time.
//
// Under REPEATABLE READ or SERIALIZABLE (PostgreSQL), an update of the
// record committed after tx took its snapshot makes the completion fail
// with a serialization failure (SQLSTATE 40001). Renewals do not update
// the record (see "Renewals on PostgreSQL" in the package documentation),
// so only a takeover, a completion, a release or a deletion does. The
// server has then aborted tx (as InnoDB has after choosing tx as a
// deadlock's victim): CompleteTx rolls tx back, so that its connection
// returns to its pool (the caller's own Rollback then returns
// sql.ErrTxDone), reads the record on a connection of the Store's
// *sql.DB, and returns an error matching
// [idem.ErrLeaseLost] (or [idem.ErrFinished], if l completed it), which
// also wraps the driver's error; should the record still be l's, the
// serialization failure is returned as it is, wrapped.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if tx == nil {
		return errors.New("sqlstore: complete in tx: nil *sql.Tx")
	}
	return s.complete(ctx, "complete in tx", tx, l, resp, retention, nil)
}

// CompleteRecord is Complete that also returns the completed record, as
// Get would return it after the completion, without reading it back on
// SQLite and PostgreSQL (the completing statement returns its columns;
// on MySQL it is Complete followed by a read). The record's Response is a
// copy of resp. When l completed the record already (a retry), it
// returns the record as it is stored, with the response stored then.
// On MySQL the record may be deleted (an operator's eviction) between the
// completion and the read: CompleteRecord then returns a zero Record and
// nil, as the completion stands. tieredstore uses it to cache what it
// completes.
func (s *Store) CompleteRecord(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) (idem.Record, error) {
	const op = "complete"
	if err := s.closed(op); err != nil {
		return idem.Record{}, err
	}
	if !s.d.completeReturns() {
		// A read back that fails leaves the record completed: the retry
		// finds it so, and succeeds.
		if err := s.complete(ctx, op, nil, l, resp, retention, nil); err != nil {
			return idem.Record{}, err
		}
		rec, err := s.get(ctx, nil, l.Scope, l.Key)
		switch {
		case errors.Is(err, idem.ErrNotFound):
			// Completed, then deleted (an operator's eviction) before the
			// read: the completion stands, and there is no record.
			return idem.Record{}, nil
		case err != nil:
			return idem.Record{}, s.fail(ctx, op+": read back", err)
		case rec.Owner != l.Owner || rec.Fence != l.Fence:
			// Deleted, and created again by another request, in between:
			// not the record completed.
			return idem.Record{}, nil
		}
		return rec, nil
	}
	var rec idem.Record
	if err := s.complete(ctx, op, nil, l, resp, retention, &rec); err != nil {
		return idem.Record{}, err
	}
	return rec, nil
}

// complete runs complete in tx (nil: on its own). With rec, on a dialect
// whose statement returns the record's columns (completeReturns), rec
// receives the completed record.
//
// When the statement matches no row, the record is read (off the hot
// path): if l completed it already, the completion is a retry, which
// succeeds without writing (rec receives the record as stored) unless it
// runs in tx, which fails with idem.ErrFinished; otherwise the lease is
// lost.
func (s *Store) complete(ctx context.Context, op string, tx *sql.Tx, l idem.Lease, resp idem.Response, retention time.Duration, rec *idem.Record) error {
	if err := s.closed(op); err != nil {
		return err
	}
	if err := validateLease(l); err != nil {
		return fmt.Errorf("sqlstore: %s: %w", op, err)
	}
	if retention <= 0 {
		return fmt.Errorf("sqlstore: %s: retention must be positive, got %v", op, retention)
	}
	v := values{
		scope:          l.Scope,
		key:            l.Key,
		owner:          l.Owner,
		fence:          l.Fence,
		responseStatus: int64(resp.StatusCode),
		responseBody:   resp.Body,
		bodyOmitted:    resp.BodyOmitted,
		retentionMS:    ceilMS(retention),
	}
	if len(resp.Header) > 0 {
		h, err := encodeHeader(resp.Header)
		if err != nil {
			return fmt.Errorf("sqlstore: %s: encode header: %w", op, err)
		}
		v.responseHeader = h
	}
	// Complete alone runs the statement as an Exec even where it returns
	// columns: database/sql starts a goroutine for every Rows read under a
	// cancellable context, and Complete needs only the affected-rows count.
	matched := true
	run := func() (err error) {
		matched = true
		if rec != nil && s.d.completeReturns() {
			var fingerprint string
			var leaseUntil, createdAt, completedAt, expiresAt int64
			err = s.queryRow(ctx, tx, s.st.complete, &v, &fingerprint, &leaseUntil, &createdAt, &completedAt, &expiresAt)
			if errors.Is(err, sql.ErrNoRows) {
				matched, err = false, nil
			} else if err == nil {
				stored := resp.Clone()
				// As Get returns them: an empty body or header reads back as nil.
				if len(stored.Body) == 0 {
					stored.Body = nil
				}
				if len(stored.Header) == 0 {
					stored.Header = nil
				}
				*rec = idem.Record{
					Scope: l.Scope, Key: l.Key, Fingerprint: idem.Fingerprint(fingerprint),
					Status: idem.StatusCompleted, Owner: l.Owner, Fence: l.Fence,
					LeaseUntil: fromMS(leaseUntil), Retention: time.Duration(v.retentionMS) * time.Millisecond,
					Response: &stored, CreatedAt: fromMS(createdAt), CompletedAt: fromMS(completedAt),
					ExpiresAt: fromMS(expiresAt),
				}
			}
			return err
		}
		var res sql.Result
		if res, err = s.exec(ctx, tx, s.st.complete, &v); err == nil {
			var n int64
			if n, err = res.RowsAffected(); err == nil {
				matched = n > 0
			}
		}
		return err
	}
	var err error
	if tx == nil {
		err = s.again(ctx, run)
	} else {
		err = run()
	}
	switch {
	case err != nil && tx != nil && s.d.retryable(err):
		return s.changedUnderTx(ctx, op, tx, l, err)
	case err != nil:
		return s.fail(ctx, op, err)
	case matched:
		return nil
	}
	done, err := s.completedBy(ctx, tx, l)
	switch {
	case err != nil:
		return fmt.Errorf("sqlstore: %s: %w", op, err)
	case tx != nil:
		return fmt.Errorf("sqlstore: %s: %w: the record is completed by this lease already (the completion committed before): roll back", op, idem.ErrFinished)
	case rec != nil:
		*rec = done
	}
	return nil
}

// changedUnderTx explains the serialization failure or deadlock err of
// the completion in tx: someone changed the record after tx took its
// snapshot (PostgreSQL), or InnoDB chose tx as a deadlock's victim. The
// database has aborted tx (PostgreSQL: every statement but ROLLBACK now
// fails; InnoDB: it rolled tx back), so the record is read outside it,
// on a connection of the Store's pool. tx is rolled back first: it holds
// a connection, perhaps the last one of that very pool, which the read
// would otherwise wait for until ctx ends.
func (s *Store) changedUnderTx(ctx context.Context, op string, tx *sql.Tx, l idem.Lease, err error) error {
	_ = tx.Rollback()
	rec, rerr := s.get(ctx, nil, l.Scope, l.Key)
	mine := rerr == nil && rec.Owner == l.Owner && rec.Fence == l.Fence
	switch {
	case rerr != nil && !errors.Is(rerr, idem.ErrNotFound), mine && rec.Status == idem.StatusProcessing:
		// Unknown, or the record is still l's: the failure as it is.
		return s.fail(ctx, op, err)
	case mine:
		return fmt.Errorf("sqlstore: %s: %w: the record is completed by this lease already (the completion committed before): roll back (%w)", op, idem.ErrFinished, err)
	default:
		return fmt.Errorf("sqlstore: %s: %w (%w)", op, lostBecause(l, rec, rerr), err)
	}
}

// Release deletes the processing record held by l so that a retry runs
// again; see [idem.Store].
func (s *Store) Release(ctx context.Context, l idem.Lease) error {
	const op = "release"
	if err := s.closed(op); err != nil {
		return err
	}
	if err := validateLease(l); err != nil {
		return fmt.Errorf("sqlstore: %s: %w", op, err)
	}
	v := values{scope: l.Scope, key: l.Key, owner: l.Owner, fence: l.Fence}
	var res sql.Result
	err := s.again(ctx, func() (err error) {
		res, err = s.exec(ctx, nil, s.st.release, &v)
		return err
	})
	if err != nil {
		return s.fail(ctx, op, err)
	}
	return s.checkHeld(ctx, op, nil, l, res)
}

// Extend moves the lease's end to the database's now + ttl and returns the
// lease with its new Until; see [idem.Store].
func (s *Store) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	const op = "extend"
	if err := s.closed(op); err != nil {
		return idem.Lease{}, err
	}
	if err := validateLease(l); err != nil {
		return idem.Lease{}, fmt.Errorf("sqlstore: %s: %w", op, err)
	}
	if ttl <= 0 {
		return idem.Lease{}, fmt.Errorf("sqlstore: %s: ttl must be positive, got %v", op, ttl)
	}
	v := values{scope: l.Scope, key: l.Key, owner: l.Owner, fence: l.Fence, leaseMS: ceilMS(ttl)}
	var until int64
	var err error
	// A serialisation failure (PostgreSQL, when the session's default
	// isolation is REPEATABLE READ or SERIALIZABLE and the record or its
	// renewal changed after the statement began) or a deadlock rolled the
	// statement back: run it again, with a new snapshot.
	for range maxAcquireAttempts {
		if s.st.selectLease.text == "" {
			err = s.queryRow(ctx, nil, s.st.extend, &v, &until)
		} else if until, err = s.extendInsertID(ctx, &v); err == nil && until == 0 {
			err = sql.ErrNoRows
		}
		if err == nil || !s.d.retryable(err) {
			break
		}
	}
	if errors.Is(err, sql.ErrNoRows) {
		return idem.Lease{}, fmt.Errorf("sqlstore: %s: %w", op, s.lost(ctx, nil, l))
	}
	if err != nil {
		return idem.Lease{}, s.fail(ctx, op, err)
	}
	l.Until = fromMS(until)
	return l, nil
}

// extendInsertID runs extend on MySQL, which has no RETURNING: the
// statement reports the new lease end as its insert id, or 0 when it
// matched no row. Reading the lease back in a second statement would not
// do: the lease may end and be taken over, or its owner release it,
// between the two, and Extend would then report ErrLeaseLost for a lease
// it extended (the linearizability check of the stores found this). A
// driver that reports no insert id gets that read all the same.
func (s *Store) extendInsertID(ctx context.Context, v *values) (int64, error) {
	res, err := s.exec(ctx, nil, s.st.extend, v)
	if err != nil {
		return 0, err
	}
	if id, err := res.LastInsertId(); err == nil {
		return id, nil
	}
	var until int64
	err = s.queryRow(ctx, nil, s.st.selectLease, v, &until)
	return until, err
}

// Get returns the record, expired or not; [idem.ErrNotFound] if none.
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	const op = "get"
	if err := s.closed(op); err != nil {
		return idem.Record{}, err
	}
	if err := validateID(scope, key); err != nil {
		return idem.Record{}, fmt.Errorf("sqlstore: %s: %w", op, err)
	}
	rec, err := s.get(ctx, nil, scope, key)
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		return idem.Record{}, s.fail(ctx, op, err)
	}
	return rec, err
}

// Delete removes the record whatever its state (operator eviction);
// [idem.ErrNotFound] if none.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	const op = "delete"
	if err := s.closed(op); err != nil {
		return err
	}
	if err := validateID(scope, key); err != nil {
		return fmt.Errorf("sqlstore: %s: %w", op, err)
	}
	v := values{scope: scope, key: key}
	var res sql.Result
	err := s.again(ctx, func() (err error) {
		res, err = s.exec(ctx, nil, s.st.deleteRecord, &v)
		return err
	})
	if err != nil {
		return s.fail(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if n == 0 {
		return idem.ErrNotFound
	}
	return nil
}

// DeleteIf removes the record whatever its state if it still has owner
// and fence, in one statement; [idem.ErrNotFound] if there is none, and an
// error matching [idem.ErrRecordChanged] if it has another owner or fence.
// See [idem.ConditionalDeleter]. On PostgreSQL the statement also says
// which; on MySQL and SQLite a refusal costs one read more.
func (s *Store) DeleteIf(ctx context.Context, scope, key, owner string, fence int64) error {
	const op = "delete if"
	if err := s.closed(op); err != nil {
		return err
	}
	if err := validateID(scope, key); err != nil {
		return fmt.Errorf("sqlstore: %s: %w", op, err)
	}
	v := values{scope: scope, key: key, owner: owner, fence: fence}
	if s.d.deleteIfReads() {
		return s.deleteIfReading(ctx, op, &v)
	}
	var res sql.Result
	err := s.again(ctx, func() (err error) {
		res, err = s.exec(ctx, nil, s.st.deleteIf, &v)
		return err
	})
	if err != nil {
		return s.fail(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if n > 0 {
		return nil
	}
	rec, err := s.get(ctx, nil, scope, key)
	if errors.Is(err, idem.ErrNotFound) {
		return err
	}
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if rec.Owner == owner && rec.Fence == fence {
		// The DELETE met the record as another execution had it, and that
		// execution then gave it back to owner and fence: impossible, as
		// owners are random; say so rather than delete what was not read.
		return fmt.Errorf("sqlstore: %s: %w: the record changed while it was being deleted", op, idem.ErrRecordChanged)
	}
	return changedFrom(op, fence, rec.Fence)
}

// deleteIfReading runs a delete_if statement that returns whether it
// deleted and the record its snapshot shows (PostgreSQL). A record shown
// with owner and fence but not deleted was changed or removed after the
// snapshot, while the DELETE waited for it: the statement runs again, with
// a new snapshot, to tell which.
func (s *Store) deleteIfReading(ctx context.Context, op string, v *values) error {
	for range maxAcquireAttempts {
		var (
			deleted int64
			owner   sql.NullString
			fence   sql.NullInt64
		)
		err := s.again(ctx, func() error {
			return s.queryRow(ctx, nil, s.st.deleteIf, v, &deleted, &owner, &fence)
		})
		switch {
		case err != nil:
			return s.fail(ctx, op, err)
		case deleted > 0:
			return nil
		case !owner.Valid:
			return idem.ErrNotFound
		case owner.String != v.owner || fence.Int64 != v.fence:
			return changedFrom(op, v.fence, fence.Int64)
		}
	}
	return fmt.Errorf("sqlstore: %s: %w: the record kept changing while it was being deleted", op, idem.ErrRecordChanged)
}

// changedFrom is DeleteIf's error for a record read at fence that is now
// another owner's, at fence now.
func changedFrom(op string, fence, now int64) error {
	return fmt.Errorf("sqlstore: %s: %w: the record read at fence %d is now fence %d of another owner", op, idem.ErrRecordChanged, fence, now)
}

// Sweep removes up to limit records whose ExpiresAt has passed on the
// database's clock (limit <= 0 means [idem.DefaultSweepLimit]) in one
// statement, and returns how many it removed. It never removes a
// processing record whose lease is live.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	const op = "sweep"
	if err := s.closed(op); err != nil {
		return 0, err
	}
	if limit <= 0 {
		limit = idem.DefaultSweepLimit
	}
	v := values{limit: int64(limit)}
	var n int64
	var err error
	// A deadlock (InnoDB's DELETE … ORDER BY … LIMIT against a renewal or
	// a completion of the same rows) or a serialisation failure rolled
	// the sweep back: it may simply run again.
	for attempt := range maxAcquireAttempts {
		if _, ok := s.d.(sweeperInTx); ok {
			n, err = s.sweepInTx(ctx, &v)
		} else {
			var res sql.Result
			if res, err = s.exec(ctx, nil, s.st.sweep, &v); err == nil {
				n, err = res.RowsAffected()
			}
		}
		if err == nil || !s.d.retryable(err) {
			break
		}
		if err := sleepCtx(ctx, time.Duration(attempt+1)*time.Millisecond); err != nil {
			return 0, s.fail(ctx, op, err)
		}
	}
	if err != nil {
		return 0, s.fail(ctx, op, err)
	}
	return int(n), nil
}

// sweeperInTx is a dialect whose sweep statement returns the number of
// records it removed and runs in a transaction begun with beginWrite
// (PostgreSQL: idem_sweep, in READ COMMITTED).
type sweeperInTx interface{ sweepInTx() }

func (s *Store) sweepInTx(ctx context.Context, v *values) (int64, error) {
	if _, err := s.prepared(ctx, s.st.sweep); err != nil {
		return 0, err
	}
	tx, err := s.d.beginWrite(ctx, s.db)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var n int64
	if err := s.queryRow(ctx, tx, s.st.sweep, v, &n); err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// get reads one record, in tx if not nil; idem.ErrNotFound if none.
func (s *Store) get(ctx context.Context, tx *sql.Tx, scope, key string) (idem.Record, error) {
	return s.scanRecord(ctx, tx, s.st.selectRecord, &values{scope: scope, key: key})
}

// scanRecord runs q, which selects the columns in lead (if any) and then
// one record's columns; idem.ErrNotFound if it returns no row.
func (s *Store) scanRecord(ctx context.Context, tx *sql.Tx, q *query, v *values, lead ...any) (idem.Record, error) {
	var r recordRow
	err := s.queryRow(ctx, tx, q, v, append(lead, r.dest()...)...)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.Record{}, idem.ErrNotFound
	}
	if err != nil {
		return idem.Record{}, err
	}
	return r.record()
}

// recordRow receives the columns of one record (select_record's).
type recordRow struct {
	rec                                           idem.Record
	fingerprint, status                           string
	leaseUntil, retentionMS, createdAt, expiresAt int64
	respStatus, completedAt                       sql.NullInt64
	header                                        sql.NullString
	body                                          []byte
	bodyOmitted                                   bool
}

// dest returns the scan destinations of a record's columns.
func (r *recordRow) dest() []any {
	return []any{&r.rec.Scope, &r.rec.Key, &r.fingerprint, &r.status, &r.rec.Owner, &r.rec.Fence,
		&r.leaseUntil, &r.retentionMS, &r.respStatus, &r.header,
		&r.body, &r.bodyOmitted, &r.createdAt, &r.completedAt, &r.expiresAt}
}

// record returns the record scanned.
func (r *recordRow) record() (idem.Record, error) {
	rec := r.rec
	scope, key := rec.Scope, rec.Key
	rec.Fingerprint = idem.Fingerprint(r.fingerprint)
	rec.Status = idem.Status(r.status)
	rec.LeaseUntil = fromMS(r.leaseUntil)
	rec.Retention = time.Duration(r.retentionMS) * time.Millisecond
	rec.CreatedAt = fromMS(r.createdAt)
	rec.ExpiresAt = fromMS(r.expiresAt)
	switch rec.Status {
	case idem.StatusProcessing:
	case idem.StatusCompleted:
		if r.completedAt.Valid {
			rec.CompletedAt = fromMS(r.completedAt.Int64)
		}
		resp := &idem.Response{StatusCode: int(r.respStatus.Int64), BodyOmitted: r.bodyOmitted}
		if len(r.body) > 0 {
			resp.Body = r.body
		}
		if r.header.Valid && r.header.String != "" {
			h, err := decodeHeader(r.header.String)
			if err != nil {
				return idem.Record{}, fmt.Errorf("record %s has a malformed header: %w", idem.HashKey(scope, key), err)
			}
			resp.Header = h
		}
		rec.Response = resp
	default:
		return idem.Record{}, fmt.Errorf("record %s has unknown status %q", idem.HashKey(scope, key), r.status)
	}
	return rec, nil
}

// DefaultListLimit is the number of records List returns when its limit
// is 0 or less.
const DefaultListLimit = 100

// List returns the oldest records (by CreatedAt, then scope and key),
// at most limit of them (limit <= 0 means DefaultListLimit): those with
// status status, or every record when status is "". Expired records not
// swept yet are included; a processing record's LeaseUntil is its lease
// as last renewed. It is for operators (idem inspect): it reads the whole
// table and sorts it, which no index serves, so keep it off hot paths.
func (s *Store) List(ctx context.Context, status idem.Status, limit int) ([]idem.Record, error) {
	const op = "list"
	if err := s.closed(op); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = DefaultListLimit
	}
	q, v := s.st.list, values{limit: int64(limit)}
	switch status {
	case "":
	case idem.StatusProcessing, idem.StatusCompleted:
		q, v.status = s.st.listStatus, string(status)
	default:
		return nil, fmt.Errorf("sqlstore: %s: unknown status %q", op, status)
	}
	var recs []idem.Record
	err := s.run(ctx, nil, q, func(st *sql.Stmt) error {
		recs = recs[:0]
		rows, err := st.QueryContext(ctx, q.args(&v)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r recordRow
			if err := rows.Scan(r.dest()...); err != nil {
				return err
			}
			rec, err := r.record()
			if err != nil {
				return err
			}
			recs = append(recs, rec)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.fail(ctx, op, err)
	}
	return recs, nil
}

// checkHeld turns a write that matched no row into ErrLeaseLost.
func (s *Store) checkHeld(ctx context.Context, op string, tx *sql.Tx, l idem.Lease, res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return s.fail(ctx, op, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlstore: %s: %w", op, s.lost(ctx, tx, l))
	}
	return nil
}

// lost explains why l no longer holds its record. It reads the record
// (off the hot path: only after a write matched nothing); the error wraps
// idem.ErrLeaseLost whatever the read finds.
func (s *Store) lost(ctx context.Context, tx *sql.Tx, l idem.Lease) error {
	rec, err := s.get(ctx, tx, l.Scope, l.Key)
	return lostBecause(l, rec, err)
}

// completedBy reads the record of l after a completion, in tx if not
// nil, matched no row: it returns the record if l completed it already,
// and otherwise an error that wraps idem.ErrLeaseLost and says why; if
// the read fails, its error (which of the two holds is then unknown).
//
// The read runs in tx, never on another connection: tx may hold the
// pool's last connection. It must see the row the completion saw:
// select_record does on SQLite (tx holds the write lock) and PostgreSQL
// (the completion and the read share tx's snapshot under REPEATABLE READ
// and SERIALIZABLE; a newer version of the row would have failed the
// completion with 40001); on MySQL, where an UPDATE reads the latest
// version of the row and a plain read in a REPEATABLE READ transaction
// its snapshot, select_record_in_tx is a locking read, which reads the
// latest version too.
func (s *Store) completedBy(ctx context.Context, tx *sql.Tx, l idem.Lease) (idem.Record, error) {
	q := s.st.selectRecord
	if tx != nil && s.st.selectRecordInTx.text != "" {
		q = s.st.selectRecordInTx
	}
	rec, err := s.scanRecord(ctx, tx, q, &values{scope: l.Scope, key: l.Key})
	switch {
	case err == nil && rec.Status == idem.StatusCompleted && rec.Owner == l.Owner && rec.Fence == l.Fence:
		return rec, nil
	case err != nil && !errors.Is(err, idem.ErrNotFound):
		// Whether l completed the record (a retry of a completion whose
		// reply was lost) or lost it is unknown: not ErrLeaseLost, which
		// would be a definite answer, false in the first case.
		return idem.Record{}, fmt.Errorf("the completion matched no row, and the read that says why failed: %w", err)
	}
	return idem.Record{}, lostBecause(l, rec, err)
}

// lostBecause is the error that says why l does not hold rec, read with
// error err.
func lostBecause(l idem.Lease, rec idem.Record, err error) error {
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return fmt.Errorf("%w: no record", idem.ErrLeaseLost)
	case err != nil:
		return idem.ErrLeaseLost
	case rec.Status != idem.StatusProcessing && rec.Owner == l.Owner && rec.Fence == l.Fence:
		return fmt.Errorf("%w: the record is %s", idem.ErrLeaseLost, rec.Status)
	case rec.Status != idem.StatusProcessing:
		return fmt.Errorf("%w: the record is %s by fence %d", idem.ErrLeaseLost, rec.Status, rec.Fence)
	default:
		return fmt.Errorf("%w: fence %d is now held by fence %d", idem.ErrLeaseLost, l.Fence, rec.Fence)
	}
}

// fail wraps a database error. When ctx is done the error says so
// (errors.Is(err, context.Canceled) holds); sql.ErrNoRows never gets
// here.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	if s.cache.isClosed() && !errors.Is(err, ErrClosed) {
		// The call ran into Close (a statement it held was closed).
		return fmt.Errorf("%w (%s: %v)", ErrClosed, op, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("sqlstore: %s: %w (%v)", op, cerr, err)
	}
	if s.d.missingTable(err) {
		return fmt.Errorf("sqlstore: %s: %w (has Store.Migrate run?)", op, err)
	}
	return fmt.Errorf("sqlstore: %s: %w", op, err)
}

func validateID(scope, key string) error {
	return errors.Join(idem.ValidateScope(scope), idem.ValidateKey(key))
}

// validateLease checks a lease's identity. A lease without owner or fence
// can hold no record: that is ErrLeaseLost, as for memstore.
func validateLease(l idem.Lease) error {
	if err := validateID(l.Scope, l.Key); err != nil {
		return err
	}
	switch {
	case l.Owner == "":
		return fmt.Errorf("%w: lease has no owner", idem.ErrLeaseLost)
	case l.Fence < 1:
		return fmt.Errorf("%w: lease has fence %d, want >= 1", idem.ErrLeaseLost, l.Fence)
	}
	return nil
}

// ceilMS returns d in whole milliseconds, rounded up so that a lease or
// retention is never shorter than asked.
func ceilMS(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

func fromMS(ms int64) time.Time { return time.UnixMilli(ms).UTC() }
