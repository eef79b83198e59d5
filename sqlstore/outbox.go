package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/outbox"
)

// outboxStatements are the statements of OutboxStore, in the block of
// queries/NAME.sql whose names start with "outbox_".
type outboxStatements struct {
	insert  *query
	claim   *query
	mark    *query
	sweep   *query
	backlog *query
}

func (st *outboxStatements) byName() map[string]**query {
	return map[string]**query{
		"outbox_insert":  &st.insert,
		"outbox_claim":   &st.claim,
		"outbox_mark":    &st.mark,
		"outbox_sweep":   &st.sweep,
		"outbox_backlog": &st.backlog,
	}
}

// The OutboxStore's statements, as indexes into its statement cache.
const (
	outboxInsert = iota
	outboxClaim
	outboxMark
	outboxSweep
	outboxBacklog
	numOutboxQueries
)

func (st *outboxStatements) query(i int) *query {
	return [...]*query{outboxInsert: st.insert, outboxClaim: st.claim, outboxMark: st.mark, outboxSweep: st.sweep, outboxBacklog: st.backlog}[i]
}

// OutboxRelayLock is the name, in idem_locks, of the lease a relay holds
// on SQLite while it claims, publishes and marks a batch.
const OutboxRelayLock = "idem_outbox"

// DefaultOutboxLease is the default of OutboxConfig.Lease.
const DefaultOutboxLease = 30 * time.Second

// OutboxConfig configures an OutboxStore.
type OutboxConfig struct {
	// Dialect is the database's dialect. Required.
	Dialect Dialect
	// IDPrefix starts the ID of every message added from now on: a
	// readable prefix (e.g. "shop-eu/") before outbox.NewID's 26
	// characters, which make the ID unique across databases and across
	// the life of one (a database re-created or restored from a backup
	// reuses row ids, never these). Add writes the ID in the row
	// (idem_outbox.msg_id) and every claim reads it back, so changing
	// the prefix changes no pending message's ID. A row added by a build
	// before that column (msg_id NULL) has no stored ID: it is published
	// as that build published it, IDPrefix and the row's id in decimal,
	// as long as IDPrefix is the prefix that build had; change the prefix
	// only once no such row is pending (SELECT count(*) FROM idem_outbox
	// WHERE msg_id IS NULL AND sent_at IS NULL is 0), or a message whose
	// first publish was not marked is published again under another ID.
	// It must be valid UTF-8
	// without control characters, and at most inbox.MaxIDLen - 26 bytes,
	// so that every ID is one that package inbox accepts
	// (inbox.Validate); NewOutboxStore refuses another. Default "": the
	// ID is the generated part alone.
	IDPrefix string
	// Lease is how long a relay's claim lasts: the batch must be
	// published and marked within it, or MarkSent answers
	// outbox.ErrLeaseLost (nothing marked: the batch is published again).
	// On SQLite it is the lease of the relay lock, and a relay that died
	// holding it keeps the others waiting that long. On PostgreSQL and
	// MySQL it bounds the batch's transaction, whose rows are otherwise
	// locked until it ends or its connection does: a connection that
	// stalls cannot hold a relay in MarkSent beyond it. (On MySQL a
	// COMMIT that stalls is bounded only by the DSN's readTimeout.)
	// Default 30 s.
	Lease time.Duration
}

// OutboxStore is an [outbox.Store] over database/sql: the messages of package outbox in the table idem_outbox,
// which Migrate creates. Add writes a message in the caller's
// transaction. Sweep and Backlog run at READ COMMITTED whatever the
// sessions' default (see ownStatements), as do the batches. It is safe for concurrent use, also by several processes
// sharing the database.
//
// A batch (Claim) is a READ COMMITTED transaction on PostgreSQL and
// MySQL/MariaDB that holds its rows with FOR UPDATE SKIP LOCKED until
// MarkSent commits it or Release rolls it back; it holds a connection of
// the pool meanwhile, and the relay publishes while it is open (mind
// idle_in_transaction_session_timeout, wait_timeout). The transaction
// ends at the latest with OutboxConfig.Lease: a MarkSent after that
// answers outbox.ErrLeaseLost. On SQLite, a batch
// holds the lease of the lock OutboxRelayLock (idem_locks, as
// LockBackend), so one relay claims at a time; a Claim while another
// holds it returns an empty batch, and MarkSent marks nothing once the
// lease ended.
//
// A relay polls it. On PostgreSQL with pgx, wrap it with package
// sqlstore/pgnotify, which adds LISTEN/NOTIFY: relays then wake as soon as
// a message commits. (That package alone imports pgx, so a MySQL or
// SQLite program never compiles it.)
type OutboxStore struct {
	db      *sql.DB
	d       Dialect
	st      *outboxStatements
	cfg     OutboxConfig
	locks   *LockBackend // SQLite
	cache   *stmtCache
	own     *ownStatements
	cleanup runtime.Cleanup
}

var (
	_ outbox.Store        = (*OutboxStore)(nil)
	_ outbox.BacklogStore = (*OutboxStore)(nil)
)

// NewOutboxStore returns an OutboxStore over db. cfg is required (for its
// Dialect) and copied. It does not touch the database: run Migrate
// before first use.
func NewOutboxStore(db *sql.DB, cfg *OutboxConfig) (*OutboxStore, error) {
	if db == nil {
		return nil, errors.New("sqlstore: NewOutboxStore: nil *sql.DB")
	}
	if cfg == nil || cfg.Dialect == nil {
		return nil, errors.New("sqlstore: NewOutboxStore: OutboxConfig.Dialect is required (e.g. sqlstore.PostgreSQL)")
	}
	c := *cfg
	if c.Lease < 0 {
		return nil, fmt.Errorf("sqlstore: NewOutboxStore: negative Lease %v", c.Lease)
	}
	if c.Lease == 0 {
		c.Lease = DefaultOutboxLease
	}
	// An ID (IDPrefix and outbox.IDLen characters, longer than any
	// legacy one: IDPrefix and a row id of at most 19 digits) must be an
	// ID every inbox takes: otherwise each message is dead-lettered by
	// its consumers.
	if err := inbox.Validate(outbox.NewID(c.IDPrefix)); err != nil {
		return nil, fmt.Errorf("sqlstore: NewOutboxStore: IDPrefix %q: %w", c.IDPrefix, err)
	}
	s := &OutboxStore{db: db, d: c.Dialect, st: &c.Dialect.statements().outbox, cfg: c, cache: newStmtCache(db, numOutboxQueries)}
	s.own = newOwnStatements(db, c.Dialect, s.cache)
	if _, ok := c.Dialect.(sqliteDialect); ok {
		b, err := NewLockBackend(db, &Config{Dialect: c.Dialect})
		if err != nil {
			return nil, err
		}
		s.locks = b
	}
	s.cleanup = runtime.AddCleanup(s, (*stmtCache).close, s.cache)
	return s, nil
}

// Migrate applies the package's migrations, idem_outbox among them: the
// same as Store.Migrate.
func (s *OutboxStore) Migrate(ctx context.Context) error {
	st, err := New(s.db, &Config{Dialect: s.d})
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Migrate(ctx)
}

// Close closes the statements the OutboxStore prepared (not the *sql.DB).
// Calls made after Close fail with ErrClosed. It is idempotent.
func (s *OutboxStore) Close() error {
	s.cleanup.Stop()
	s.cache.close()
	if s.locks != nil {
		_ = s.locks.Close()
	}
	return nil
}

// stmt returns statement i prepared on the database, in tx if tx is not
// nil; or nil, nil if tx is not nil and the statement was never prepared:
// the caller then runs the statement's text in tx. Preparing on the pool
// would need a second connection while tx holds one (and wait forever
// for it when every connection is so held): Claim prepares its
// statements before it begins its transaction, and prepares
// outbox_insert for Add.
func (s *OutboxStore) stmt(ctx context.Context, tx *sql.Tx, i int) (*sql.Stmt, error) {
	return s.cache.stmt(ctx, tx, i, s.st.query(i).text)
}

func (s *OutboxStore) fail(ctx context.Context, op string, err error) error {
	if s.cache.isClosed() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w (outbox %s: %v)", ErrClosed, op, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("sqlstore: outbox %s: %w (%v)", op, cerr, err)
	}
	if s.d.missingTable(err) {
		return fmt.Errorf("sqlstore: outbox %s: %w (has Migrate run?)", op, err)
	}
	return fmt.Errorf("sqlstore: outbox %s: %w", op, err)
}

// Add writes msg, pending, in the caller's transaction tx, and returns
// its ID: OutboxConfig.IDPrefix and outbox.NewID, made here (no round
// trip but the insert) and written in the row, which keeps it for every
// publish. The message exists if and only if tx commits; on PostgreSQL
// the commit wakes the listening relays. msg.ID and msg.CreatedAt are ignored; an invalid message
// (outbox.Message.Validate) is refused before any statement. tx may
// belong to another *sql.DB on the same database.
func (s *OutboxStore) Add(ctx context.Context, tx *sql.Tx, msg outbox.Message) (string, error) {
	const op = "add"
	if tx == nil {
		return "", errors.New("sqlstore: outbox add: nil *sql.Tx")
	}
	if err := msg.Validate(); err != nil {
		return "", err
	}
	v := values{topic: msg.Topic, msgKey: msg.Key, payload: msg.Payload}
	if v.payload == nil {
		v.payload = []byte{}
	}
	if len(msg.Headers) > 0 {
		h, err := json.Marshal(msg.Headers)
		if err != nil {
			return "", fmt.Errorf("sqlstore: outbox add: headers: %w", err)
		}
		v.headers = string(h)
	}
	id := outbox.NewID(s.cfg.IDPrefix)
	v.messageID = id
	args := s.st.insert.args(&v)
	err := s.cache.run(ctx, tx, outboxInsert, s.st.insert.text, func(st *sql.Stmt) (err error) {
		if st != nil {
			_, err = st.ExecContext(ctx, args...)
		} else {
			_, err = tx.ExecContext(ctx, s.st.insert.text, args...)
		}
		return err
	})
	if err != nil {
		return "", s.fail(ctx, op, err)
	}
	return id, nil
}

// legacyID is the ID of a row added before migration msg_id (an older
// build), whose msg_id is NULL: the prefix and the row's id, as that
// build published it.
func (s *OutboxStore) legacyID(row int64) string {
	return s.cfg.IDPrefix + strconv.FormatInt(row, 10)
}

// Claim implements outbox.Store; see OutboxStore for how a batch holds
// its messages. A deadlock (MySQL) is retried.
func (s *OutboxStore) Claim(ctx context.Context, limit int) (outbox.Batch, error) {
	const op = "claim"
	if s.cache.isClosed() {
		return nil, fmt.Errorf("%w (outbox claim)", ErrClosed)
	}
	if limit <= 0 {
		return nil, fmt.Errorf("sqlstore: outbox claim: limit %d", limit)
	}
	// Prepared before a transaction holds a connection (see stmt).
	for _, i := range []int{outboxInsert, outboxClaim, outboxMark} {
		if _, err := s.stmt(ctx, nil, i); err != nil {
			return nil, s.fail(ctx, op, err)
		}
	}
	if s.locks != nil {
		return s.claimLeased(ctx, limit)
	}
	var err error
	for attempt := range maxAcquireAttempts {
		var b *outboxBatch
		if b, err = s.claimTx(ctx, limit); err == nil {
			return b, nil
		}
		if !s.d.retryable(err) {
			break
		}
		if err := sleepCtx(ctx, time.Duration(attempt+1)*time.Millisecond); err != nil {
			return nil, s.fail(ctx, op, err)
		}
	}
	return nil, s.fail(ctx, op, err)
}

func (s *OutboxStore) claimTx(ctx context.Context, limit int) (*outboxBatch, error) {
	// Not ctx: database/sql rolls a transaction back when the context it
	// began with ends, and a batch's marks must commit even after the
	// relay's context ended (what the broker confirmed is marked). But
	// not without an end either: a connection that stalls (the network,
	// not the server, fails) would hold the relay in MarkSent forever,
	// and the batch's rows locked while the connection lives. The
	// transaction ends with the lease (OutboxConfig.Lease), or with ctx
	// while the claim runs.
	deadline := time.Now().Add(s.cfg.Lease)
	txCtx, cancelTx := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	stop := context.AfterFunc(ctx, cancelTx)
	tx, err := s.d.beginWrite(txCtx, s.db) // READ COMMITTED
	if err != nil {
		stop()
		cancelTx()
		return nil, err
	}
	b := &outboxBatch{s: s, tx: tx, deadline: deadline, cancel: cancelTx}
	err = s.read(ctx, tx, b, limit)
	if !stop() && err == nil {
		err = context.Cause(ctx) // the transaction was cancelled with ctx
	}
	if err != nil {
		_ = tx.Rollback()
		cancelTx()
		return nil, err
	}
	return b, nil
}

// claimLeased takes the relay lease (SQLite) and reads the heads.
func (s *OutboxStore) claimLeased(ctx context.Context, limit int) (outbox.Batch, error) {
	owner := lock.NewOwner()
	deadline := time.Now().Add(s.cfg.Lease) // the lease begins after this
	fence, err := s.locks.Acquire(ctx, OutboxRelayLock, owner, s.cfg.Lease)
	if errors.Is(err, lock.ErrHeld) {
		return &outboxBatch{s: s}, nil // another relay is at work
	}
	if err != nil {
		return nil, err
	}
	b := &outboxBatch{s: s, owner: owner, fence: fence, deadline: deadline}
	if err := s.read(ctx, nil, b, limit); err != nil {
		_ = s.locks.Release(context.WithoutCancel(ctx), OutboxRelayLock, owner, fence)
		return nil, s.fail(ctx, "claim", err)
	}
	return b, nil
}

// mustStmt is stmt, but prepares statement i in tx (for tx's life) if it
// was never prepared.
func (s *OutboxStore) mustStmt(ctx context.Context, tx *sql.Tx, i int) (*sql.Stmt, error) {
	st, err := s.stmt(ctx, tx, i)
	if st == nil && err == nil {
		return tx.PrepareContext(ctx, s.st.query(i).text)
	}
	return st, err
}

// read runs the claim statement into b.
func (s *OutboxStore) read(ctx context.Context, tx *sql.Tx, b *outboxBatch, limit int) error {
	st, err := s.mustStmt(ctx, tx, outboxClaim)
	if err != nil {
		return err
	}
	rows, err := st.QueryContext(ctx, s.st.claim.args(&values{limit: int64(limit)})...)
	if err != nil {
		return err
	}
	defer rows.Close()
	b.rows = map[string]int64{}
	for rows.Next() {
		var (
			id, created int64
			m           outbox.Message
			msgID       sql.NullString
			headers     sql.NullString
		)
		if err := rows.Scan(&id, &msgID, &m.Topic, &m.Key, &m.Payload, &headers, &created); err != nil {
			return err
		}
		if headers.Valid && headers.String != "" {
			if err := json.Unmarshal([]byte(headers.String), &m.Headers); err != nil {
				return fmt.Errorf("message %d: headers: %w", id, err)
			}
		}
		if len(m.Payload) == 0 {
			m.Payload = nil
		}
		m.ID = msgID.String
		if !msgID.Valid {
			m.ID = s.legacyID(id)
		}
		m.CreatedAt = fromMS(created)
		b.msgs = append(b.msgs, m)
		b.rows[m.ID] = id
	}
	return rows.Err()
}

// Sweep implements outbox.Store. On PostgreSQL and MySQL it waits for a
// batch that holds a row it deletes (none: a batch holds pending rows).
func (s *OutboxStore) Sweep(ctx context.Context, retention time.Duration, limit int) (int, error) {
	const op = "sweep"
	if limit <= 0 || retention < 0 {
		return 0, fmt.Errorf("sqlstore: outbox sweep: limit %d, retention %v", limit, retention)
	}
	args := s.st.sweep.args(&values{retentionMS: retention.Milliseconds(), limit: int64(limit)})
	var (
		n   int64
		err error
	)
	for attempt := range maxAcquireAttempts {
		err = s.own.run(ctx, outboxSweep, s.st.sweep.text, func(st *sql.Stmt) error {
			res, err := st.ExecContext(ctx, args...)
			if err == nil {
				n, err = res.RowsAffected()
			}
			return err
		})
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

// Backlog implements outbox.BacklogStore: one statement counts the
// pending rows over the index of pending rows, and the age of the oldest
// is counted on the database's clock. It reads every pending row's
// index entry: a backlog of millions of rows takes a while to count.
func (s *OutboxStore) Backlog(ctx context.Context) (outbox.Backlog, error) {
	const op = "backlog"
	var (
		n       int64
		oldest  sql.NullInt64
		nowMS   int64
		backlog outbox.Backlog
	)
	err := s.own.run(ctx, outboxBacklog, s.st.backlog.text, func(st *sql.Stmt) error {
		return st.QueryRowContext(ctx).Scan(&n, &oldest, &nowMS)
	})
	if err != nil {
		return outbox.Backlog{}, s.fail(ctx, op, err)
	}
	if n > 0 && oldest.Valid {
		backlog = outbox.Backlog{Pending: n, Oldest: fromMS(oldest.Int64), Age: max(time.Duration(nowMS-oldest.Int64)*time.Millisecond, 0)}
	}
	return backlog, nil
}

// OutboxChannel is the PostgreSQL channel that the outbox migration's
// trigger notifies on every insert into idem_outbox (see package
// sqlstore/pgnotify, which wakes relays with it).
const OutboxChannel = "idem_outbox"

// outboxBatch is a claim: a transaction holding the rows (tx), or the
// relay lease (owner, fence; SQLite), or nothing (an empty SQLite batch).
type outboxBatch struct {
	s  *OutboxStore
	tx *sql.Tx
	// deadline ends tx (cancel releases its context), or the lease of
	// the relay lock (SQLite), at the latest.
	deadline time.Time
	cancel   context.CancelFunc
	owner    string
	fence    int64
	msgs     []outbox.Message
	rows     map[string]int64 // ID → row id
	done     bool
}

func (b *outboxBatch) Messages() []outbox.Message { return b.msgs }

// Deadline implements outbox.Deadliner: the batch's claim ends by then
// (OutboxConfig.Lease after the claim began).
func (b *outboxBatch) Deadline() time.Time { return b.deadline }

func (b *outboxBatch) MarkSent(ctx context.Context, ids []string) error {
	const op = "mark sent"
	if b.done {
		return outbox.ErrBatchDone
	}
	rowIDs := make([]int64, 0, len(ids))
	for _, id := range ids {
		r, ok := b.rows[id]
		if !ok {
			return fmt.Errorf("sqlstore: outbox mark sent: %q is not in the batch", id)
		}
		rowIDs = append(rowIDs, r)
	}
	b.done = true
	s := b.s
	if b.tx == nil && b.owner == "" { // an empty SQLite batch
		return nil
	}
	if b.tx != nil {
		defer b.cancel()
		defer b.tx.Rollback() //nolint:errcheck // a no-op after Commit
		mctx, cancel := context.WithDeadline(ctx, b.deadline)
		defer cancel()
		err := b.mark(mctx, b.tx, rowIDs)
		if err == nil {
			err = b.tx.Commit()
		}
		if err != nil && !time.Now().Before(b.deadline) {
			return fmt.Errorf("%w (the batch's lease of %v ended: %v)", outbox.ErrLeaseLost, s.cfg.Lease, err)
		}
		if err != nil {
			return s.fail(ctx, op, err)
		}
		return nil
	}
	// SQLite: the marks, in one transaction, each under the lease.
	defer s.locks.Release(context.WithoutCancel(ctx), OutboxRelayLock, b.owner, b.fence) //nolint:errcheck // ErrNotHeld once the lease ended
	tx, err := s.d.beginWrite(ctx, s.db)
	if err != nil {
		return s.fail(ctx, op, err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := b.mark(ctx, tx, rowIDs); err != nil {
		if errors.Is(err, outbox.ErrLeaseLost) {
			return err
		}
		return s.fail(ctx, op, err)
	}
	if err := tx.Commit(); err != nil {
		return s.fail(ctx, op, err)
	}
	return nil
}

// mark runs the mark statement for each row in tx. On SQLite a row not
// marked means that the lease ended: outbox.ErrLeaseLost.
func (b *outboxBatch) mark(ctx context.Context, tx *sql.Tx, rowIDs []int64) error {
	s := b.s
	st, err := s.mustStmt(ctx, tx, outboxMark)
	if err != nil {
		return err
	}
	v := values{name: OutboxRelayLock, owner: b.owner, fence: b.fence}
	for _, id := range rowIDs {
		v.outboxID = id
		res, err := st.ExecContext(ctx, s.st.mark.args(&v)...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n != 1 {
			if b.owner != "" {
				return outbox.ErrLeaseLost
			}
			// The row is locked by this batch: it cannot have changed.
			return fmt.Errorf("outbox row %d: %d rows marked", id, n)
		}
	}
	return nil
}

func (b *outboxBatch) Release(ctx context.Context) error {
	if b.done {
		return outbox.ErrBatchDone
	}
	b.done = true
	switch {
	case b.tx != nil:
		defer b.cancel()
		if err := b.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			return b.s.fail(ctx, "release", err)
		}
	case b.owner != "":
		err := b.s.locks.Release(ctx, OutboxRelayLock, b.owner, b.fence)
		if err != nil && !errors.Is(err, lock.ErrNotHeld) {
			return b.s.fail(ctx, "release", err)
		}
	}
	return nil
}
