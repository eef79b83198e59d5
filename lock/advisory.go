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

// The advisory-lock helpers have one shape: (ctx, the transaction or
// session the lock belongs to, the lock's name). The name is the lock's
// identity in every helper (PostgreSQL's are keyed by PGAdvisoryKey(name));
// ctx bounds every wait, and the Try variants do not wait: they answer an
// error matching ErrHeld. A lock scoped to a transaction ends with it and
// returns only an error; a lock scoped to a session returns its release.
// An empty or invalid name is ErrInvalidName.

// PGAdvisoryXactLock takes PostgreSQL's transaction-level advisory lock
// on PGAdvisoryKey(name) (pg_advisory_xact_lock) in tx, waiting while
// another transaction holds it, until ctx ends (the error then matches
// ErrHeld and ctx's error). The lock is released when tx commits or rolls
// back; there is no release call. It excludes only other takers of the
// same key (it does not lock any row), and a transaction holding it keeps
// it for as long as it runs: keep such transactions short. The driver
// must be PostgreSQL's ($1 placeholders: pgx, lib/pq).
func PGAdvisoryXactLock(ctx context.Context, tx *sql.Tx, name string) error {
	key, err := pgKey(name)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("lock: pg_advisory_xact_lock(%q): %w (%w)", name, ErrHeld, context.Cause(ctx))
		}
		return fmt.Errorf("lock: pg_advisory_xact_lock(%q): %w", name, err)
	}
	return nil
}

// PGTryAdvisoryXactLock is PGAdvisoryXactLock without the wait
// (pg_try_advisory_xact_lock): ErrHeld when another transaction holds
// the lock.
func PGTryAdvisoryXactLock(ctx context.Context, tx *sql.Tx, name string) error {
	key, err := pgKey(name)
	if err != nil {
		return err
	}
	var ok bool
	if err := tx.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&ok); err != nil {
		return fmt.Errorf("lock: pg_try_advisory_xact_lock(%q): %w", name, err)
	}
	if !ok {
		return fmt.Errorf("lock: pg advisory lock %q: %w", name, ErrHeld)
	}
	return nil
}

// pgKey validates name and returns its key.
func pgKey(name string) (int64, error) {
	if name == "" || !utf8.ValidString(name) {
		return 0, fmt.Errorf("%w: a PostgreSQL advisory lock name is non-empty valid UTF-8", ErrInvalidName)
	}
	return PGAdvisoryKey(name), nil
}

// MaxMySQLLockName is the longest name MySQL's GET_LOCK accepts, in
// characters.
const MaxMySQLLockName = 64

// MaxMySQLLockNameBytes is the longest name GET_LOCK accepts, in bytes of
// UTF-8 (the go-sql-driver/mysql connections' utf8mb4): 64 characters of
// MySQL's three-byte utf8 system charset. MariaDB refuses a longer name
// ("Identifier name ... is too long", 1059) even within 64 characters,
// as 64 four-byte characters (emoji) are.
const MaxMySQLLockNameBytes = 3 * MaxMySQLLockName

// mysqlNoTimeout is GET_LOCK's timeout for a wait without limit, in
// seconds: the year MySQL waits for a negative timeout (LONG_TIMEOUT).
// MariaDB refuses a negative timeout (NULL, warning 1411).
const mysqlNoTimeout = 365 * 24 * 3600

// MySQLGetLock takes MySQL's (or MariaDB's) named lock name with GET_LOCK
// on conn's session, waiting while another session holds it, until ctx
// ends: the server waits until ctx's deadline (rounded up to whole
// seconds; a year, MySQL's own bound, without one), and the error then
// matches ErrHeld (and ctx's error once ctx has ended; the driver may then
// have closed conn, which ends its session). GET_LOCK
// answering NULL (an error in the server, the session killed) is an
// error.
//
// The lock belongs to conn's session: release it with the returned func
// (RELEASE_LOCK, on conn; ErrNotHeld when the session no longer holds
// it), or close conn, which ends the session and releases it. Use conn
// for nothing that may close it meanwhile, and hand it back to the pool
// only after release. GET_LOCK is reentrant in a session: each success
// needs its own release. A name is 1 to 64 characters (MaxMySQLLockName)
// and at most 192 bytes of UTF-8 (MaxMySQLLockNameBytes);
// locks are server-wide, so prefix names with the application's.
//
// Such a lock lasts as long as the session, not a lease: if the session
// dies, the server frees the lock while the program may still believe it
// holds it. It has no fencing token; pair it with one (a Locker) where a
// resource must refuse a stale holder.
func MySQLGetLock(ctx context.Context, conn *sql.Conn, name string) (release func(context.Context) error, err error) {
	secs := int64(mysqlNoTimeout)
	if d, ok := ctx.Deadline(); ok {
		secs = max(0, int64(math.Ceil(time.Until(d).Seconds())))
	}
	return mysqlGetLock(ctx, conn, name, secs)
}

// MySQLTryGetLock is MySQLGetLock without the wait (GET_LOCK with a
// timeout of 0): ErrHeld when another session holds the lock.
func MySQLTryGetLock(ctx context.Context, conn *sql.Conn, name string) (release func(context.Context) error, err error) {
	return mysqlGetLock(ctx, conn, name, 0)
}

// mysqlGetLock runs GET_LOCK(name, secs) on conn.
func mysqlGetLock(ctx context.Context, conn *sql.Conn, name string, secs int64) (func(context.Context) error, error) {
	if name == "" || utf8.RuneCountInString(name) > MaxMySQLLockName || len(name) > MaxMySQLLockNameBytes || !utf8.ValidString(name) {
		return nil, fmt.Errorf("%w: a MySQL lock name is 1 to %d characters and at most %d bytes of valid UTF-8", ErrInvalidName, MaxMySQLLockName, MaxMySQLLockNameBytes)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", name, secs).Scan(&got); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("lock: GET_LOCK(%q): %w (%w)", name, ErrHeld, context.Cause(ctx))
		}
		return nil, fmt.Errorf("lock: GET_LOCK(%q): %w", name, err)
	}
	switch {
	case !got.Valid:
		return nil, fmt.Errorf("lock: GET_LOCK(%q) returned NULL (an error in the server, or the session was killed)", name)
	case got.Int64 != 1:
		if ctx.Err() != nil {
			return nil, fmt.Errorf("lock: GET_LOCK(%q): %w (%w)", name, ErrHeld, context.Cause(ctx))
		}
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
