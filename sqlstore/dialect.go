package sqlstore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/idemkit/idem/sqldialect"
)

// Dialect is the SQL flavour a Store speaks: its statements, its migrations
// and how it begins a write transaction. Use the values this package
// exports ([SQLite], [PostgreSQL], [MySQL]); the methods are unexported, so a dialect is added here,
// as a value and its .sql files, and nowhere else.
//
// A dialect's statements live in queries/NAME.sql and its migrations in
// migrations/NAME/NNNN_description.sql, where NAME is its String.
//
// A Dialect is also a sqldialect.Dialect: its Family names its SQL family,
// so that one value configures sqlstore and the packages of the core
// module that write SQL (fsm.TableConfig.Dialect takes sqlstore.PostgreSQL
// as it is).
type Dialect interface {
	// String returns the dialect's name: "sqlite", "postgres" or "mysql".
	String() string
	// Family returns the dialect's SQL family: sqldialect.PostgreSQL,
	// sqldialect.MySQL or sqldialect.SQLite.
	Family() sqldialect.Family

	// statements returns the parsed queries/NAME.sql.
	statements() *statements
	// migrations returns migrations/NAME/*.sql in version order.
	migrations() []migration
	// beginWrite begins the transactions the package begins itself to
	// write: Acquire's, whose first statement writes (the upsert), Sweep's,
	// an inbox Claim's (whose first statement is a locking read) and a
	// SQLite outbox batch's marks. It must not fail half way on a lock
	// upgrade. On PostgreSQL and MySQL they are READ COMMITTED.
	beginWrite(ctx context.Context, db *sql.DB) (*sql.Tx, error)
	// beginSchema begins the transaction of Migrate, holding the lock that
	// serialises migrations across processes from its start (before the
	// lock_schema statement, which takes it where a statement is needed).
	beginSchema(ctx context.Context, db *sql.DB) (writeTx, error)
	// missingTable reports whether err says that a table does not exist,
	// which means Migrate was not run.
	missingTable(err error) bool
	// completeReturns reports whether the complete statement returns the
	// record's fingerprint, lease_until, created_at, completed_at and
	// expires_at (RETURNING); if not, it is an UPDATE whose affected rows
	// say whether the lease held (MySQL).
	completeReturns() bool
	// deleteIfReads reports whether the delete_if statement returns a
	// row: how many records it deleted, and the owner and fence of the
	// record its snapshot shows (PostgreSQL); if not, it is a DELETE
	// whose affected rows say whether it deleted, and select_record then
	// tells a missing record from another's.
	deleteIfReads() bool
	// acquireMode says how Store.Acquire runs on the dialect.
	acquireMode() acquireMode
	// retryable reports whether err aborted a statement that may simply
	// run again (a deadlock or a serialisation failure): Acquire retries
	// such errors a bounded number of times.
	retryable(err error) bool
}

// acquireMode is the shape of Acquire on a dialect.
type acquireMode uint8

const (
	// acquireInTx: select_held, then a write transaction with the acquire
	// upsert (… RETURNING fence, lease_until, created_at, now) and, when
	// it returns no row, select_record under the same lock (SQLite).
	acquireInTx acquireMode = iota + 1
	// acquireOneStatement: the acquire statement answers everything,
	// returning the record, which is ours if it carries our owner, and no
	// row only when the record it met vanished before it could read it:
	// then it runs again (PostgreSQL).
	acquireOneStatement
	// acquireUpsertRead: select_held; then the acquire upsert, which
	// returns nothing, and select_record, whose owner tells whether the
	// upsert took the record (MySQL).
	acquireUpsertRead
)

//go:embed queries/*.sql migrations/*/*.sql
var sqlFiles embed.FS

// writeTx is the transaction of Migrate: a *sql.Tx, or a transaction
// begun by hand on a *sql.Conn.
type writeTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	Commit() error
	Rollback() error
}

// statements are the SQL texts of one dialect, one per operation.
type statements struct {
	createMigrationsTable *query
	lockSchema            *query // may be empty
	selectMigrations      *query
	insertMigration       *query
	acquire               *query
	selectRecord          *query
	selectRecordInTx      *query // may be empty: select_record serves (see Store.completedBy)
	selectHeld            *query // may be empty: acquire reads it (PostgreSQL)
	complete              *query
	extend                *query
	selectLease           *query // may be empty: extend returns lease_until
	release               *query
	deleteRecord          *query
	deleteIf              *query
	sweep                 *query
	list                  *query // Store.List
	listStatus            *query

	// Tokens (TokenStore).
	tokenInsert  *query
	tokenConsume *query
	tokenSelect  *query
	tokenSweep   *query
	tokenTrim    *query
	tokenTrimDel *query           // may be empty: token_trim deletes (all but MySQL)
	lock         lockStatements   // the statements of LockBackend (lock.go)
	outbox       outboxStatements // the statements of OutboxStore (outbox.go)
	inbox        inboxStatements  // the statements of InboxStore (inbox.go)
	steps        stepsStatements  // the statements of StepJournal (steps.go)
}

// numQueries is the number of statements of a dialect.
const numQueries = 17 + 6 // idem_records and migrations; tokens

func (st *statements) byName() map[string]**query {
	return map[string]**query{
		"create_migrations_table": &st.createMigrationsTable,
		"lock_schema":             &st.lockSchema,
		"select_migrations":       &st.selectMigrations,
		"insert_migration":        &st.insertMigration,
		"acquire":                 &st.acquire,
		"select_record":           &st.selectRecord,
		"select_record_in_tx":     &st.selectRecordInTx,
		"select_held":             &st.selectHeld,
		"complete":                &st.complete,
		"extend":                  &st.extend,
		"select_lease":            &st.selectLease,
		"release":                 &st.release,
		"delete":                  &st.deleteRecord,
		"delete_if":               &st.deleteIf,
		"sweep":                   &st.sweep,
		"list":                    &st.list,
		"list_status":             &st.listStatus,

		"token_insert":      &st.tokenInsert,
		"token_consume":     &st.tokenConsume,
		"token_select":      &st.tokenSelect,
		"token_sweep":       &st.tokenSweep,
		"token_trim":        &st.tokenTrim,
		"token_trim_delete": &st.tokenTrimDel,
	}
}

// param names one value a statement binds.
type param uint8

const (
	pScope param = iota + 1
	pKey
	pFingerprint
	pOwner
	pFence
	pLeaseMS
	pRetentionMS
	pResponseStatus
	pResponseHeader
	pResponseBody
	pBodyOmitted
	pLimit
	pVersion
	pName

	// Tokens.
	pDigest
	pResult
	pTTLMS
	pTokenFingerprint
	pKeepMS
	pKeep

	// Outbox.
	pOutboxID
	pTopic
	pMsgKey
	pPayload
	pHeaders
	// Inbox.
	pGroup
	pMessageID
	pStatus
	pAttempts
	pMaxAttempts
	pReason
	pAt
	pLeaseUntil
	// Steps.
	pStep
	pInput
	pDelayMS
)

var paramNames = map[string]param{
	"scope":           pScope,
	"key":             pKey,
	"fingerprint":     pFingerprint,
	"owner":           pOwner,
	"fence":           pFence,
	"lease_ms":        pLeaseMS,
	"retention_ms":    pRetentionMS,
	"response_status": pResponseStatus,
	"response_header": pResponseHeader,
	"response_body":   pResponseBody,
	"body_omitted":    pBodyOmitted,
	"limit":           pLimit,
	"version":         pVersion,
	"name":            pName,

	"digest": pDigest,
	"result": pResult,
	"ttl_ms": pTTLMS,

	"token_fingerprint": pTokenFingerprint,
	"keep_ms":           pKeepMS,
	"keep":              pKeep,

	"id":           pOutboxID,
	"topic":        pTopic,
	"msg_key":      pMsgKey,
	"payload":      pPayload,
	"headers":      pHeaders,
	"group":        pGroup,
	"message_id":   pMessageID,
	"status":       pStatus,
	"attempts":     pAttempts,
	"max_attempts": pMaxAttempts,
	"reason":       pReason,
	"at":           pAt,
	"lease_until":  pLeaseUntil,
	"step":         pStep,
	"input":        pInput,
	"delay_ms":     pDelayMS,
}

// values holds everything a statement may bind.
type values struct {
	scope, key     string
	fingerprint    string
	owner          string
	fence          int64
	leaseMS        int64
	retentionMS    int64
	responseStatus int64
	responseHeader any // string or nil (NULL)
	responseBody   []byte
	bodyOmitted    bool
	limit          int64
	version        int64
	name           string

	// Tokens.
	digest string
	result []byte // nil or empty: NULL
	ttlMS  int64
	// tokenFP is a Spend's fingerprint ("": NULL), keepMS its Keep, keep
	// the count of Trim.
	tokenFP      string
	keepMS, keep int64

	// Outbox.
	outboxID int64
	topic    string
	msgKey   string
	payload  []byte // never nil: the column is NOT NULL
	headers  any    // JSON text, or nil (NULL)
	// Inbox.
	group, messageID, status, reason      string
	attempts, maxAttempts, at, leaseUntil int64
	// Steps.
	step    string
	input   []byte // never nil: the column is NOT NULL
	delayMS int64
}

// query is one statement and the parameters it binds, in order. A dialect
// whose placeholders cannot repeat (MySQL's ?) lists a parameter as often
// as it uses it.
type query struct {
	id     int // index into the statement cache of a Store
	name   string
	text   string
	params []param
}

// args returns the statement's arguments taken from v.
func (q *query) args(v *values) []any {
	a := make([]any, len(q.params))
	for i, p := range q.params {
		switch p {
		case pScope:
			a[i] = v.scope
		case pKey:
			a[i] = v.key
		case pFingerprint:
			a[i] = v.fingerprint
		case pOwner:
			a[i] = v.owner
		case pFence:
			a[i] = v.fence
		case pLeaseMS:
			a[i] = v.leaseMS
		case pRetentionMS:
			a[i] = v.retentionMS
		case pResponseStatus:
			a[i] = v.responseStatus
		case pResponseHeader:
			a[i] = v.responseHeader
		case pResponseBody:
			a[i] = v.responseBody
		case pBodyOmitted:
			a[i] = v.bodyOmitted
		case pLimit:
			a[i] = v.limit
		case pVersion:
			a[i] = v.version
		case pName:
			a[i] = v.name
		case pDigest:
			a[i] = v.digest
		case pResult:
			if len(v.result) == 0 {
				a[i] = nil
			} else {
				a[i] = v.result
			}
		case pTTLMS:
			a[i] = v.ttlMS
		case pTokenFingerprint:
			if v.tokenFP == "" {
				a[i] = nil
			} else {
				a[i] = v.tokenFP
			}
		case pKeepMS:
			a[i] = v.keepMS
		case pKeep:
			a[i] = v.keep
		case pOutboxID:
			a[i] = v.outboxID
		case pTopic:
			a[i] = v.topic
		case pMsgKey:
			a[i] = v.msgKey
		case pPayload:
			a[i] = v.payload
		case pHeaders:
			a[i] = v.headers
		case pGroup:
			a[i] = v.group
		case pMessageID:
			a[i] = v.messageID
		case pStatus:
			a[i] = v.status
		case pAttempts:
			a[i] = v.attempts
		case pMaxAttempts:
			a[i] = v.maxAttempts
		case pReason:
			a[i] = v.reason
		case pAt:
			a[i] = v.at
		case pLeaseUntil:
			a[i] = v.leaseUntil
		case pStep:
			a[i] = v.step
		case pInput:
			a[i] = v.input
		case pDelayMS:
			a[i] = v.delayMS
		}
	}
	return a
}

// parseStatements reads a query file: statements introduced by
// "-- name: NAME", each optionally followed by "-- params: a b c". Every
// statement the dialect needs must be present; unknown names and
// parameters are errors.
func parseStatements(file string, src string) (*statements, error) {
	st := &statements{}
	slots := st.byName()
	var cur *query
	var body []string
	finish := func() error {
		if cur == nil {
			return nil
		}
		cur.text = strings.TrimSuffix(strings.TrimSpace(strings.Join(body, "\n")), ";")
		slot, ok := slots[cur.name]
		if !ok {
			slot, ok = st.lock.byName()[cur.name]
		}
		if !ok {
			slot, ok = st.outbox.byName()[cur.name]
		}
		if !ok {
			slot, ok = st.inbox.byName()[cur.name]
		}
		if !ok {
			slot, ok = st.steps.byName()[cur.name]
		}
		if !ok {
			return fmt.Errorf("%s: unknown statement %q", file, cur.name)
		}
		if *slot != nil {
			return fmt.Errorf("%s: statement %q defined twice", file, cur.name)
		}
		*slot = cur
		return nil
	}
	ids := 0
	for n, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(trimmed, "-- name:"); ok {
			if err := finish(); err != nil {
				return nil, err
			}
			cur, body = &query{id: ids, name: strings.TrimSpace(name)}, nil
			ids++
			continue
		}
		if cur == nil {
			continue // the file's preamble
		}
		if list, ok := strings.CutPrefix(trimmed, "-- params:"); ok {
			for _, f := range strings.Fields(list) {
				p, ok := paramNames[f]
				if !ok {
					return nil, fmt.Errorf("%s:%d: unknown parameter %q", file, n+1, f)
				}
				cur.params = append(cur.params, p)
			}
			continue
		}
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		body = append(body, line)
	}
	if err := finish(); err != nil {
		return nil, err
	}
	if len(slots) != numQueries {
		panic("sqlstore: numQueries is out of date")
	}
	maps.Copy(slots, st.lock.byName())
	maps.Copy(slots, st.outbox.byName())
	maps.Copy(slots, st.inbox.byName())
	maps.Copy(slots, st.steps.byName())
	for name, slot := range slots {
		if *slot == nil {
			return nil, fmt.Errorf("%s: statement %q missing", file, name)
		}
		if (*slot).text == "" && name != "lock_schema" && name != "select_lease" && name != "select_held" && name != "select_record_in_tx" && name != "token_trim_delete" {
			return nil, fmt.Errorf("%s: statement %q is empty", file, name)
		}
	}
	return st, nil
}

// migration is one versioned schema change.
type migration struct {
	version int64
	name    string // the file name without version and extension
	stmts   []string
}

// loadMigrations reads dir's NNNN_description.sql files in version order.
// Versions start at 1, are unique and leave no gaps.
func loadMigrations(fsys fs.FS, dir string) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		file := e.Name()
		if e.IsDir() || path.Ext(file) != ".sql" {
			continue
		}
		num, name, ok := strings.Cut(strings.TrimSuffix(file, ".sql"), "_")
		version, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || version < 1 || name == "" {
			return nil, fmt.Errorf("%s/%s: want NNNN_description.sql", dir, file)
		}
		src, err := fs.ReadFile(fsys, path.Join(dir, file))
		if err != nil {
			return nil, err
		}
		stmts := splitStatements(string(src))
		if len(stmts) == 0 {
			return nil, fmt.Errorf("%s/%s: no statement", dir, file)
		}
		ms = append(ms, migration{version: version, name: name, stmts: stmts})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != int64(i+1) {
			return nil, fmt.Errorf("%s: migration %d (%s) where %d was expected", dir, m.version, m.name, i+1)
		}
	}
	return ms, nil
}

// splitStatements splits a migration file into statements: each ends with
// a semicolon at the end of a line outside a dollar-quoted body ($$ … $$,
// a PostgreSQL function's). Comment-only chunks are dropped.
func splitStatements(src string) []string {
	var out, cur []string
	flush := func() {
		text := strings.TrimSpace(strings.Join(cur, "\n"))
		cur = cur[:0]
		for _, l := range strings.Split(text, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
				out = append(out, strings.TrimSuffix(text, ";"))
				return
			}
		}
	}
	quoted := false
	for _, line := range strings.Split(src, "\n") {
		cur = append(cur, line)
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "--") {
			continue
		}
		if strings.Count(t, "$$")%2 == 1 {
			quoted = !quoted
		}
		if !quoted && strings.HasSuffix(t, ";") {
			flush()
		}
	}
	flush()
	return out
}

// mustLoad parses a dialect's embedded files. The files are part of the
// package, so an error is a bug caught by the package's tests.
func mustLoad(name string) (*statements, []migration) {
	file := "queries/" + name + ".sql"
	src, err := fs.ReadFile(sqlFiles, file)
	if err != nil {
		panic("sqlstore: " + err.Error())
	}
	st, err := parseStatements(file, string(src))
	if err != nil {
		panic("sqlstore: " + err.Error())
	}
	ms, err := loadMigrations(sqlFiles, "migrations/"+name)
	if err != nil {
		panic("sqlstore: " + err.Error())
	}
	return st, ms
}

// Retryable reports whether err (or an error it wraps) is one after which
// the whole transaction may simply run again: a PostgreSQL
// serialization_failure (40001, which a session whose default isolation
// is REPEATABLE READ or SERIALIZABLE meets on a write conflict) or
// deadlock_detected (40P01), or a MySQL/MariaDB deadlock (1213, which
// InnoDB also answers for a SERIALIZABLE read's lock conflict). It is the
// classification the Store uses for its own statements. A lock wait
// timeout (MySQL 1205) is not retryable: it already waited
// innodb_lock_wait_timeout. SQLite reports neither (busy_timeout waits).
func Retryable(err error) bool {
	return err != nil && (PostgreSQL.retryable(err) || MySQL.retryable(err))
}
