package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/token"
)

// TokenStore is a [token.Store] and [token.TxStore] over database/sql: the
// pre-issued submit tokens of package token, in the table idem_tokens,
// which Migrate creates with idem_records. It is safe for concurrent use,
// also by several processes sharing the database. Create it with
// NewTokenStore, create its table with Migrate, and Close it when done.
// Sweep it now and then: expired tokens stay in the table until Sweep
// removes them.
//
// Every operation is one statement in the common case. Consume is one
// UPDATE that spends the token only if it is live, unused and of the
// caller's scope, and keeps it Spend.Keep after the use; when it spends nothing, a read tells a used token (with
// its result) from an invalid one — on PostgreSQL that read is part of the
// same statement, and a second statement runs only for a token spent
// concurrently. Times (expiry, use) come from the database's clock.
type TokenStore struct {
	s *Store
}

var (
	_ token.Store   = (*TokenStore)(nil)
	_ token.TxStore = (*TokenStore)(nil)
)

// NewTokenStore returns a TokenStore over db. cfg is required (for its
// Dialect) and is copied; its Logger receives the migrations Migrate
// applies. NewTokenStore does not touch the database: call Migrate before
// first use.
func NewTokenStore(db *sql.DB, cfg *Config) (*TokenStore, error) {
	if db == nil {
		return nil, errors.New("sqlstore: NewTokenStore: nil *sql.DB")
	}
	if cfg == nil || cfg.Dialect == nil {
		return nil, errors.New("sqlstore: NewTokenStore: Config.Dialect is required (e.g. sqlstore.PostgreSQL)")
	}
	s, err := New(db, cfg)
	if err != nil {
		return nil, err
	}
	return &TokenStore{s: s}, nil
}

// Migrate creates or updates the schema: idem_tokens, and the idem_records
// of Store, which share their migrations (see Store.Migrate).
func (t *TokenStore) Migrate(ctx context.Context) error { return t.s.Migrate(ctx) }

// Close closes the statements the TokenStore prepared; see Store.Close.
func (t *TokenStore) Close() error { return t.s.Close() }

// Insert stores a new token; see [token.Store]. A digest already in the
// table, expired or not, gives token.ErrDuplicate. A serialisation failure
// (a digest inserted concurrently, under a session default of
// SERIALIZABLE) is retried.
func (t *TokenStore) Insert(ctx context.Context, scope, digest string, ttl time.Duration) (time.Time, error) {
	const op = "token insert"
	s := t.s
	if err := s.closed(op); err != nil {
		return time.Time{}, err
	}
	if ttl <= 0 {
		return time.Time{}, fmt.Errorf("sqlstore: %s: ttl %v is not positive", op, ttl)
	}
	v := values{digest: digest, scope: scope, ttlMS: ceilMS(ttl)}
	q := s.st.tokenInsert
	if _, ok := s.d.(mysqlDialect); ok {
		res, err := s.exec(ctx, nil, q, &v)
		if mysqlErrNumber(err) == 1062 { // ER_DUP_ENTRY
			return time.Time{}, token.ErrDuplicate
		}
		if err != nil {
			return time.Time{}, s.fail(ctx, op, err)
		}
		now, err := res.LastInsertId()
		if err != nil {
			return time.Time{}, s.fail(ctx, op, err)
		}
		return fromMS(now + v.ttlMS), nil
	}
	var exp int64
	var err error
	for attempt := range maxAcquireAttempts {
		// Under SERIALIZABLE (a session default), PostgreSQL fails an
		// insert that met a digest another transaction committed after
		// the statement's snapshot: a new snapshot sees the digest stored.
		err = s.queryRow(ctx, nil, q, &v, &exp)
		if err == nil || !s.d.retryable(err) {
			break
		}
		if err := sleepCtx(ctx, time.Duration(attempt+1)*time.Millisecond); err != nil {
			return time.Time{}, s.fail(ctx, op, err)
		}
	}
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, token.ErrDuplicate
	}
	if err != nil {
		return time.Time{}, s.fail(ctx, op, err)
	}
	return fromMS(exp), nil
}

// Consume spends a token; see [token.Store]. A deadlock or a
// serialisation failure, which rolled the statement back, is retried.
func (t *TokenStore) Consume(ctx context.Context, scope, digest string, sp token.Spend) error {
	const op = "token consume"
	if err := t.s.closed(op); err != nil {
		return err
	}
	var err error
	for attempt := range maxAcquireAttempts {
		err = t.consume(ctx, nil, scope, digest, sp)
		if err == nil || !t.s.d.retryable(err) {
			break
		}
		if err := sleepCtx(ctx, time.Duration(attempt+1)*time.Millisecond); err != nil {
			return t.s.fail(ctx, op, err)
		}
	}
	return t.answer(ctx, op, err)
}

// ConsumeTx is Consume in the caller's transaction tx; see
// [token.TxStore]. The token's row stays locked until tx ends (on SQLite,
// tx holds the database's write lock): a concurrent Consume waits, and
// then answers token.ErrUsed with this call's result if tx commits, or
// spends the token itself if tx rolls back. tx may belong to another
// *sql.DB on the same database.
//
// When tx runs at REPEATABLE READ or SERIALIZABLE on PostgreSQL, a token
// spent by another transaction after tx's snapshot fails with a
// serialisation failure (SQLSTATE 40001) rather than token.ErrUsed, and a
// SERIALIZABLE tx's Commit may fail with one. Either way tx spent nothing:
// roll it back and run it again (sqlstore.Retryable reports these errors).
// The TokenStore's own statements (Insert, Consume, Trim, Sweep) run at
// READ COMMITTED whatever the session's default (see the package doc).
// On SQLite, begin tx with sqlite.Open's settings (IMMEDIATE):
// a deferred transaction that has read before may fail to take the write
// lock.
func (t *TokenStore) ConsumeTx(ctx context.Context, tx *sql.Tx, scope, digest string, sp token.Spend) error {
	const op = "token consume in tx"
	if tx == nil {
		return errors.New("sqlstore: token consume in tx: nil *sql.Tx")
	}
	if err := t.s.closed(op); err != nil {
		return err
	}
	return t.answer(ctx, op, t.consume(ctx, tx, scope, digest, sp))
}

// answer passes the answers of the contract through and wraps the rest.
func (t *TokenStore) answer(ctx context.Context, op string, err error) error {
	if err == nil || errors.Is(err, token.ErrInvalid) || errors.Is(err, token.ErrUsed) {
		return err
	}
	return t.s.fail(ctx, op, err)
}

// consume runs the dialect's consume, in tx when tx is not nil.
func (t *TokenStore) consume(ctx context.Context, tx *sql.Tx, scope, digest string, sp token.Spend) error {
	if len(sp.Result) > token.MaxResultLen {
		return fmt.Errorf("%w: %d bytes", token.ErrResultTooLarge, len(sp.Result))
	}
	s := t.s
	v := values{digest: digest, scope: scope, result: sp.Result, tokenFP: sp.Fingerprint, keepMS: max(0, ceilMS(sp.Keep))}
	q := s.st.tokenConsume
	// A token seen unused by the read that follows a consume that spent
	// nothing was spent and then released by a transaction that rolled
	// back in between: the consume runs again.
	for range maxAcquireAttempts {
		switch s.d.(type) {
		case postgresDialect:
			var (
				first  bool
				usedAt sql.NullInt64
				res    []byte
				fp     sql.NullString
			)
			err := s.queryRow(ctx, tx, q, &v, &first, &usedAt, &res, &fp)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return token.ErrInvalid
			case err != nil:
				return err
			case first:
				return nil
			case usedAt.Valid:
				return &token.UsedError{UsedAt: fromMS(usedAt.Int64), Result: res, Fingerprint: fp.String}
			}
		case mysqlDialect:
			r, err := s.exec(ctx, tx, q, &v)
			if err != nil {
				return err
			}
			n, err := r.RowsAffected()
			if err != nil {
				return err
			}
			if n == 1 {
				return nil
			}
		default:
			var usedAt int64
			err := s.queryRow(ctx, tx, q, &v, &usedAt)
			if err == nil {
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		var (
			usedAt sql.NullInt64
			res    []byte
			fp     sql.NullString
		)
		err := s.queryRow(ctx, tx, s.st.tokenSelect, &v, &usedAt, &res, &fp)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return token.ErrInvalid
		case err != nil:
			return err
		case usedAt.Valid:
			return &token.UsedError{UsedAt: fromMS(usedAt.Int64), Result: res, Fingerprint: fp.String}
		}
	}
	return errors.New("token consume: the token changed under every attempt")
}

// Sweep removes up to limit expired tokens, used or not, and returns how
// many it removed; a limit <= 0 means token.DefaultSweepLimit. On
// PostgreSQL it skips rows a transaction holds (a ConsumeTx in progress);
// on MySQL it waits for them.
func (t *TokenStore) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		limit = token.DefaultSweepLimit
	}
	return t.deleteRows(ctx, "token sweep", t.s.st.tokenSweep, &values{limit: int64(limit)})
}

// Trim removes the unused tokens of scope but its keep newest live ones;
// see [token.Store]. It is one DELETE, which waits for a row a
// transaction holds (a ConsumeTx in progress on an old token) and then
// leaves it if that transaction spent it. On MySQL it is a plain SELECT
// of the tokens to remove, which locks nothing, and a DELETE by primary
// key of each (one, after each Issue, once a scope has its keep): a
// single DELETE would lock the rows it reads and deadlock with
// transactions that spend tokens (see queries/mysql.sql).
func (t *TokenStore) Trim(ctx context.Context, scope string, keep int) (int, error) {
	const op = "token trim"
	if keep < 0 {
		return 0, fmt.Errorf("sqlstore: %s: keep %d is negative", op, keep)
	}
	v := values{scope: scope, keep: int64(keep)}
	if t.s.st.tokenTrimDel.text == "" {
		return t.deleteRows(ctx, op, t.s.st.tokenTrim, &v)
	}
	if err := t.s.closed(op); err != nil {
		return 0, err
	}
	var digests []string
	err := t.s.run(ctx, nil, t.s.st.tokenTrim, func(st *sql.Stmt) error {
		rows, err := st.QueryContext(ctx, t.s.st.tokenTrim.args(&v)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var d string
			if err := rows.Scan(&d); err != nil {
				return err
			}
			digests = append(digests, d)
		}
		return rows.Err()
	})
	if err != nil {
		return 0, t.s.fail(ctx, op, err)
	}
	n := 0
	for _, d := range digests {
		m, err := t.deleteRows(ctx, op, t.s.st.tokenTrimDel, &values{digest: d, scope: scope})
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// deleteRows runs the DELETE q and returns the rows it removed. A
// deadlock or a serialisation failure, which rolled it back, is retried.
func (t *TokenStore) deleteRows(ctx context.Context, op string, q *query, v *values) (int, error) {
	s := t.s
	if err := s.closed(op); err != nil {
		return 0, err
	}
	var (
		n   int64
		err error
	)
	for attempt := range maxAcquireAttempts {
		var res sql.Result
		if res, err = s.exec(ctx, nil, q, v); err == nil {
			n, err = res.RowsAffected()
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
