package lock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// PGAdvisoryKey maps a lock name to a PostgreSQL advisory-lock key: the
// first 8 bytes of the SHA-256 of the name's bytes, read as a big-endian
// two's-complement int64. In SQL the same key is
//
//	('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 16))::bit(64)::bigint
//
// so that programs in other languages can take the same lock. Distinct
// names share a key with probability about n²/2⁶⁵ for n names.
func PGAdvisoryKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// PGAdvisoryXactLock takes PostgreSQL's transaction-level advisory lock
// key (pg_advisory_xact_lock) in tx, waiting while another transaction
// holds it, at most until ctx ends. The lock is released when tx commits
// or rolls back; there is no release call. It excludes only other takers
// of the same key (it does not lock any row), and a transaction holding
// it keeps it for as long as it runs: keep such transactions short. The
// driver must be PostgreSQL's ($1 placeholders: pgx, lib/pq).
func PGAdvisoryXactLock(ctx context.Context, tx *sql.Tx, key int64) error {
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		return fmt.Errorf("lock: pg_advisory_xact_lock(%d): %w", key, err)
	}
	return nil
}

// PGTryAdvisoryXactLock is PGAdvisoryXactLock without the wait
// (pg_try_advisory_xact_lock): ErrHeld when another transaction holds
// key.
func PGTryAdvisoryXactLock(ctx context.Context, tx *sql.Tx, key int64) error {
	var ok bool
	if err := tx.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&ok); err != nil {
		return fmt.Errorf("lock: pg_try_advisory_xact_lock(%d): %w", key, err)
	}
	if !ok {
		return fmt.Errorf("lock: pg advisory key %d: %w", key, ErrHeld)
	}
	return nil
}

// MaxMySQLLockName is the longest name MySQL's GET_LOCK accepts, in
// characters.
const MaxMySQLLockName = 64

// mysqlNoTimeout is GET_LOCK's timeout for a wait without limit, in
// seconds: the year MySQL waits for a negative timeout (LONG_TIMEOUT).
// MariaDB refuses a negative timeout (NULL, warning 1411).
const mysqlNoTimeout = 365 * 24 * 3600

// MySQLGetLock takes MySQL's (or MariaDB's) named lock name with GET_LOCK
// on conn's session, waiting up to timeout (rounded up to whole seconds;
// 0 tries once; negative waits without limit: a year, MySQL's own bound
// for a negative timeout, sent as such because MariaDB answers a negative
// timeout with NULL), and at most until ctx ends. It returns ErrHeld if another session still held the lock when
// the wait ended. GET_LOCK answering NULL (an error in the server, the
// session killed) is an error.
//
// The lock belongs to conn's session: release it with the returned func
// (RELEASE_LOCK, on conn; ErrNotHeld when the session no longer holds
// it), or close conn, which ends the session and releases it. Use conn
// for nothing that may close it meanwhile, and hand it back to the pool
// only after release. GET_LOCK is reentrant in a session: each success
// needs its own release. A name is 1 to 64 characters (MaxMySQLLockName);
// locks are server-wide, so prefix names with the application's.
//
// Such a lock lasts as long as the session, not a lease: if the session
// dies, the server frees the lock while the program may still believe it
// holds it. It has no fencing token; pair it with one (a Locker) where a
// resource must refuse a stale holder.
func MySQLGetLock(ctx context.Context, conn *sql.Conn, name string, timeout time.Duration) (release func(context.Context) error, err error) {
	if name == "" || utf8.RuneCountInString(name) > MaxMySQLLockName || !utf8.ValidString(name) {
		return nil, fmt.Errorf("%w: a MySQL lock name is 1 to %d characters of valid UTF-8", ErrInvalidName, MaxMySQLLockName)
	}
	secs := int64(mysqlNoTimeout)
	if timeout >= 0 {
		secs = int64(math.Ceil(timeout.Seconds()))
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", name, secs).Scan(&got); err != nil {
		return nil, fmt.Errorf("lock: GET_LOCK(%q): %w", name, err)
	}
	switch {
	case !got.Valid:
		return nil, fmt.Errorf("lock: GET_LOCK(%q) returned NULL (an error in the server, or the session was killed)", name)
	case got.Int64 != 1:
		return nil, fmt.Errorf("lock: GET_LOCK(%q): %w", name, ErrHeld)
	}
	return func(ctx context.Context) error {
		var rel sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", name).Scan(&rel); err != nil {
			return fmt.Errorf("lock: RELEASE_LOCK(%q): %w", name, err)
		}
		if !rel.Valid || rel.Int64 != 1 {
			return fmt.Errorf("lock: RELEASE_LOCK(%q): %w", name, ErrNotHeld)
		}
		return nil
	}, nil
}
