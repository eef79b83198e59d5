package uniq

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/sqldialect"
)

// DefaultBatchSize is how many rows InsertBatch writes per statement when
// BatchSpec.Size is 0.
const DefaultBatchSize = 1000

// Bound parameters one statement may carry: PostgreSQL's wire protocol
// counts them in 16 bits; MySQL and MariaDB refuse a prepared statement
// with more than 65535 placeholders; SQLite's SQLITE_MAX_VARIABLE_NUMBER
// is 32766 by default since 3.32.0 (modernc.org/sqlite and mattn's
// go-sqlite3 keep the default).
const (
	maxParamsPostgres = 65535
	maxParamsMySQL    = 65535
	maxParamsSQLite   = 32766
)

// BatchSpec says where InsertBatch inserts: a table, its columns, and the
// column of the unique index that makes a row "already there".
// Identifiers are written into the SQL as they are, unquoted: each must be
// a plain identifier (a letter or '_', then letters, digits and '_', at
// most 63 bytes); Table may be qualified by a schema ("shop.products").
type BatchSpec struct {
	// Dialect is the database's SQL family: a sqldialect.Family or a
	// store's dialect that names one (sqlstore.PostgreSQL). Required.
	Dialect sqldialect.Dialect
	// Table is the table's name. Required.
	Table string
	// Columns are the columns each row gives values for, in the order of
	// the row's values. Required; Key must be one of them.
	Columns []string
	// Key is the column of the unique index (or primary key) that holds
	// the business key, one column: a row whose key is there already is
	// not written. Required.
	Key string
	// Size is the most rows one statement writes. Zero means
	// DefaultBatchSize; any size is lowered so that a statement stays
	// within the database's limit of bound parameters (65535 on
	// PostgreSQL and MySQL/MariaDB, 32766 on SQLite). Lower it for wide
	// rows on MySQL/MariaDB, whose statement must also fit
	// max_allowed_packet.
	Size int
}

// An Outcome is what InsertBatch did with one row.
type Outcome uint8

// The outcomes of a row.
const (
	// NotWritten: the call ended (an error, a cancelled context) before
	// the row's statement committed. The row may have to be written
	// again; running the whole input again is safe.
	NotWritten Outcome = iota
	// Created: this call inserted the row.
	Created
	// Existing: the key was there already, or the same key came earlier
	// in the input (the row's other values were not written).
	Existing
)

// String returns "not written", "created" or "already there".
func (o Outcome) String() string {
	switch o {
	case NotWritten:
		return "not written"
	case Created:
		return "created"
	case Existing:
		return "already there"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// KeyMismatchError is returned by InsertBatch on PostgreSQL or SQLite when
// the database reports a key it inserted that is none of the input's keys
// as given: the column stores the value in another form (a uuid in lower
// case, CHAR(n) padded with spaces, a numeric with another scale, a
// trigger that rewrites it). On a *sql.DB or *sql.Conn the statement is
// rolled back (InsertBatch ran it in a transaction of its own); in the
// caller's transaction, roll it back. Pass keys in the form the database
// stores them.
type KeyMismatchError struct {
	// Key is the key as the database returned it.
	Key string
}

// Error says which key and what to do.
func (e *KeyMismatchError) Error() string {
	return "uniq: the database inserted key " + strconv.Quote(e.Key) +
		", which is none of the input's keys as given: pass keys in the form the column stores them"
}

// InsertBatch inserts rows into spec.Table, skipping every row whose key
// (the value of the spec.Key column) is there already, and reports per row
// whether it was Created by this call or Existing. Rows are written in
// statements of at most spec.Size rows, each its own atomic statement: a
// call that fails or is cancelled half way leaves the statements before
// committed (their rows report Created or Existing, the others
// NotWritten), and running the whole input again writes each row once —
// the rows of the first run then report Existing.
//
// Of any number of concurrent calls (on any number of processes) with
// overlapping keys, exactly one creates each key and reports it Created;
// every other call reports it Existing. The database's unique index on
// Key decides, as it does for InsertOrGet. Within one input, the second
// and later copies of a key (equal as Go values after database/sql's
// conversion) report Existing and are not sent, on every dialect; copies
// that only the column's collation makes equal ('ABC' and 'abc' in a
// case-insensitive column) also report Existing, found by the database.
//
// rows[i] holds the values of spec.Columns, in order. InsertBatch refuses,
// before it writes anything, a spec without a valid Dialect, Table,
// Columns or Key, a Key not among Columns, a column given twice, a row of
// another length than Columns and a row whose key is nil (NULL never
// collides in a unique index, so it would be inserted every time). The
// key's value must be one database/sql converts (strings, []byte,
// integers, floats, bools, time.Time, driver.Valuers): it is compared
// with the keys the database reports as database/sql converts them to a
// string.
//
// q is a *sql.DB, *sql.Tx or *sql.Conn. With a transaction (a *sql.Tx, or
// a type with its Commit and Rollback methods), every statement runs in it
// and commits with it: Created then means "created, if you commit". How
// each dialect learns which rows were new:
//
//   - PostgreSQL and SQLite (3.35 or later): INSERT … ON CONFLICT (key)
//     DO NOTHING RETURNING key; the rows returned are the new ones.
//     Outside a caller's transaction each statement runs in a transaction
//     of its own, first without RETURNING: when it inserted all its rows
//     or none (a fresh import, a re-run over rows all there), the count
//     says which are new and it commits; otherwise it is rolled back and
//     run again with RETURNING. Reading no rows back keeps the common
//     cases as fast as a plain INSERT. A [*KeyMismatchError] leaves no
//     row of its statement behind. Key must have a unique index or constraint on exactly
//     that column (the database refuses the statement otherwise). A
//     collision on another unique index is an error, not a skip. In a
//     PostgreSQL transaction at REPEATABLE READ or SERIALIZABLE a key
//     committed after the snapshot is a serialisation failure (SQLSTATE
//     40001): retry the transaction.
//   - MySQL and MariaDB: a plain multi-row INSERT, which is atomic: when
//     it succeeds every row in it is new, and a fresh import costs what an
//     unguarded one does. When it fails on a duplicate (and wrote
//     nothing), the keys that exist are read (a locking read, LOCK IN
//     SHARE MODE, in a transaction, so that it sees the latest committed
//     rows) and the INSERT is run again without them; another caller may
//     have committed more meanwhile, so this repeats while each read finds
//     more. When a read finds none of the keys (a key equal only under
//     the collation, or a collision on another unique index), the rows
//     are inserted one by one, each duplicate read back by its key, as
//     InsertOrGet does, up to DefaultAttempts tries each ([Attempts]
//     changes it); a duplicate that is never found is an
//     [*UnresolvedError]. No INSERT IGNORE (which also turns truncation,
//     NOT NULL and foreign-key errors into warnings) and no ON DUPLICATE
//     KEY UPDATE (which would skip a collision on any unique index
//     silently). Key must have a unique index: MySQL cannot be told which
//     index to check, and without one every row is inserted. In a caller's
//     transaction at REPEATABLE READ, the locking read of absent keys
//     takes gap locks, so concurrent imports of neighbouring keys may
//     deadlock (error 1213, the whole transaction rolled back): retry it,
//     or import outside a transaction.
//
// Each statement writes its rows sorted by key (their bytes, as
// compared after the conversion above), so that concurrent imports take
// the keys' locks in one order and do not deadlock on each other. A
// column whose collation orders keys otherwise (case-insensitive, with
// mixed case) may still deadlock (PostgreSQL 40P01, MySQL 1213): the
// statement is rolled back and the error returned; run the input again.
//
// Any other error is returned wrapped, with the outcomes of the rows
// written before it.
func InsertBatch(ctx context.Context, q Querier, spec BatchSpec, rows [][]any, opts ...Option) ([]Outcome, error) {
	b, err := newBatch(spec)
	if err != nil {
		return nil, err
	}
	o := options{attempts: DefaultAttempts}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.err != nil {
		return nil, o.err
	}
	if q == nil {
		return nil, errors.New("uniq: InsertBatch needs a Querier (*sql.DB, *sql.Tx or *sql.Conn)")
	}
	b.attempts = o.attempts
	b.inTx = isTx(q)

	keys := make([]string, len(rows))
	first := make(map[string]int, len(rows))
	copyOf := map[int]int{} // a later copy's index → its key's first index
	send := make([]int, 0, len(rows))
	for i, r := range rows {
		if len(r) != len(b.cols) {
			return nil, fmt.Errorf("uniq: InsertBatch: rows[%d] has %d values for %d columns", i, len(r), len(b.cols))
		}
		k, err := keyString(r[b.key])
		if err != nil {
			return nil, fmt.Errorf("uniq: InsertBatch: rows[%d]: key %s: %w", i, b.cols[b.key], err)
		}
		keys[i] = k
		if j, ok := first[k]; ok {
			copyOf[i] = j
			continue
		}
		first[k] = i
		send = append(send, i)
	}

	out := make([]Outcome, len(rows))
	finish := func() []Outcome {
		for i, j := range copyOf {
			if out[j] != NotWritten {
				out[i] = Existing
			}
		}
		return out
	}
	for start := 0; start < len(send); start += b.size {
		if ctx.Err() != nil {
			return finish(), fmt.Errorf("uniq: InsertBatch: %w", context.Cause(ctx))
		}
		// Each statement writes its rows in the order of their keys, so
		// that concurrent statements over overlapping keys take the keys'
		// locks in one order and cannot deadlock on each other.
		chunk := send[start:min(start+b.size, len(send))]
		slices.SortFunc(chunk, func(i, j int) int { return strings.Compare(keys[i], keys[j]) })
		var err error
		if b.family == sqldialect.MySQL {
			err = b.mysqlChunk(ctx, q, rows, keys, chunk, out)
		} else {
			err = b.returningChunk(ctx, q, rows, keys, chunk, out)
		}
		if err != nil {
			return finish(), fmt.Errorf("uniq: InsertBatch: a statement of %d rows including rows[%d]: %w", len(chunk), send[start], withCause(ctx, err))
		}
	}
	return finish(), nil
}

// batch is a validated BatchSpec.
type batch struct {
	family   sqldialect.Family
	table    string
	cols     []string
	key      int    // index of the key in cols
	size     int    // rows per statement
	prefix   string // INSERT INTO table (cols) VALUES
	inTx     bool
	attempts int
}

func newBatch(s BatchSpec) (*batch, error) {
	if s.Dialect == nil {
		return nil, errors.New("uniq: BatchSpec.Dialect is required (e.g. sqldialect.PostgreSQL or sqlstore.PostgreSQL)")
	}
	b := &batch{family: s.Dialect.Family(), table: s.Table, cols: s.Columns, key: -1}
	maxParams := 0
	switch b.family {
	case sqldialect.PostgreSQL:
		maxParams = maxParamsPostgres
	case sqldialect.MySQL:
		maxParams = maxParamsMySQL
	case sqldialect.SQLite:
		maxParams = maxParamsSQLite
	default:
		return nil, fmt.Errorf("uniq: BatchSpec.Dialect: unknown SQL family %v", b.family)
	}
	if s.Table == "" {
		return nil, errors.New("uniq: BatchSpec.Table is required")
	}
	parts := strings.Split(s.Table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("uniq: BatchSpec.Table %q: at most one '.' (schema.table)", s.Table)
	}
	for _, p := range parts {
		if err := checkIdent(p); err != nil {
			return nil, fmt.Errorf("uniq: BatchSpec.Table: %w", err)
		}
	}
	if s.Key == "" {
		return nil, errors.New("uniq: BatchSpec.Key is required: the column of the unique index that holds the business key")
	}
	if len(s.Columns) == 0 {
		return nil, errors.New("uniq: BatchSpec.Columns is required")
	}
	seen := map[string]bool{}
	for i, c := range s.Columns {
		if err := checkIdent(c); err != nil {
			return nil, fmt.Errorf("uniq: BatchSpec.Columns[%d]: %w", i, err)
		}
		lc := strings.ToLower(c)
		if seen[lc] {
			return nil, fmt.Errorf("uniq: BatchSpec.Columns: %q appears twice", c)
		}
		seen[lc] = true
		if strings.EqualFold(c, s.Key) {
			b.key = i
		}
	}
	if b.key < 0 {
		return nil, fmt.Errorf("uniq: BatchSpec.Key %q is not among Columns %v", s.Key, s.Columns)
	}
	switch {
	case s.Size < 0:
		return nil, fmt.Errorf("uniq: BatchSpec.Size %d: at least 0 (0 means %d)", s.Size, DefaultBatchSize)
	case s.Size == 0:
		b.size = DefaultBatchSize
	default:
		b.size = s.Size
	}
	b.size = max(1, min(b.size, maxParams/len(s.Columns)))
	b.prefix = "INSERT INTO " + s.Table + " (" + strings.Join(s.Columns, ", ") + ") VALUES "
	return b, nil
}

// checkIdent refuses anything but a plain SQL identifier.
func checkIdent(s string) error {
	bad := s == "" || len(s) > 63 || '0' <= s[0] && s[0] <= '9'
	for i := 0; i < len(s) && !bad; i++ {
		c := s[i]
		bad = !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_')
	}
	if bad {
		return fmt.Errorf("%q is not a plain identifier (a letter or '_', then letters, digits and '_', at most 63 bytes)", s)
	}
	return nil
}

// keyString returns v as database/sql would convert it to a string when
// scanned into one, so that the input's keys and the keys a database
// returns compare equal when they are the same value.
func keyString(v any) (string, error) {
	dv, err := driver.DefaultParameterConverter.ConvertValue(v)
	if err != nil {
		return "", err
	}
	switch x := dv.(type) {
	case nil:
		return "", errors.New("is NULL, which never collides in a unique index")
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	case time.Time:
		return x.Format(time.RFC3339Nano), nil
	}
	return "", fmt.Errorf("unsupported type %T", dv)
}

// insertSQL returns the multi-row INSERT of rows[idx...] and its
// arguments.
func (b *batch) insertSQL(rows [][]any, idx []int) (string, []any) {
	var sb strings.Builder
	args := make([]any, 0, len(idx)*len(b.cols))
	sb.Grow(len(b.prefix) + len(idx)*len(b.cols)*7)
	sb.WriteString(b.prefix)
	n := 0
	for r, i := range idx {
		if r > 0 {
			sb.WriteString(", ")
		}
		sb.WriteByte('(')
		for c, v := range rows[i] {
			if c > 0 {
				sb.WriteString(", ")
			}
			n++
			b.placeholder(&sb, n)
			args = append(args, v)
		}
		sb.WriteByte(')')
	}
	return sb.String(), args
}

// placeholder writes the n-th (from 1) placeholder of the dialect.
func (b *batch) placeholder(sb *strings.Builder, n int) {
	if b.family == sqldialect.PostgreSQL {
		sb.WriteByte('$')
		sb.WriteString(strconv.Itoa(n))
		return
	}
	sb.WriteByte('?')
}

// beginner begins transactions: *sql.DB and *sql.Conn.
type beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// returningChunk writes rows[chunk...] with INSERT … ON CONFLICT (key) DO
// NOTHING (PostgreSQL, SQLite). Outside a caller's transaction it runs
// in one of its own and first without RETURNING: when the statement
// inserts every row or none, the count of rows it inserted says which
// rows are new, and reading no rows back is what makes the common cases
// (a fresh import, a re-run over rows all there) as fast as a plain
// INSERT. Only when it inserted some of them is it rolled back and run
// again with RETURNING key, which names them.
func (b *batch) returningChunk(ctx context.Context, q Querier, rows [][]any, keys []string, chunk []int, out []Outcome) error {
	query, args := b.insertSQL(rows, chunk)
	key := b.cols[b.key]
	query += " ON CONFLICT (" + key + ") DO NOTHING"
	bg, ok := q.(beginner)
	if !ok || b.inTx {
		return b.returning(ctx, q, query, args, keys, chunk, out)
	}
	tx, err := bg.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	switch n {
	case int64(len(chunk)), 0:
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		o := Created
		if n == 0 {
			o = Existing
		}
		for _, i := range chunk {
			out[i] = o
		}
		return nil
	}
	if err := tx.Rollback(); err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	if tx, err = bg.BeginTx(ctx, nil); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if err := b.returning(ctx, tx, query, args, keys, chunk, out); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		for _, i := range chunk {
			out[i] = NotWritten // nothing of the chunk was written after all
		}
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// returning runs query (an INSERT … ON CONFLICT DO NOTHING of
// rows[chunk...]) with RETURNING key on q, and marks the rows it returns
// Created and the others Existing.
func (b *batch) returning(ctx context.Context, q Querier, query string, args []any, keys []string, chunk []int, out []Outcome) error {
	idx := make(map[string]int, len(chunk))
	for _, i := range chunk {
		idx[keys[i]] = i
	}
	created := make([]int, 0, len(chunk))
	rs, err := q.QueryContext(ctx, query+" RETURNING "+b.cols[b.key], args...)
	if err != nil {
		return err
	}
	defer rs.Close()
	for rs.Next() {
		var k string
		if err := rs.Scan(&k); err != nil {
			return err
		}
		i, ok := idx[k]
		if !ok {
			return &KeyMismatchError{Key: k}
		}
		created = append(created, i)
	}
	if err := rs.Err(); err != nil {
		return err
	}
	if err := rs.Close(); err != nil {
		return err
	}
	for _, i := range chunk {
		out[i] = Existing
	}
	for _, i := range created {
		out[i] = Created
	}
	return nil
}

// mysqlChunk writes rows[chunk...] on MySQL/MariaDB: one plain INSERT of
// them all; on a duplicate (which wrote nothing), it reads which keys
// exist and inserts the others, and so on; when a read finds none of the
// keys it inserted, it inserts them one by one.
func (b *batch) mysqlChunk(ctx context.Context, q Querier, rows [][]any, keys []string, chunk []int, out []Outcome) error {
	fresh := chunk
	for {
		query, args := b.insertSQL(rows, fresh)
		_, err := q.ExecContext(ctx, query, args...)
		if err == nil {
			for _, i := range fresh {
				out[i] = Created
			}
			return nil
		}
		if !IsDuplicate(err) {
			return err
		}
		// The INSERT wrote nothing. Some keys were there, or another
		// caller committed them meanwhile (MySQL waits for its commit
		// before it answers a duplicate): read which.
		found, err := b.mysqlExisting(ctx, q, rows, fresh)
		if err != nil {
			return err
		}
		next := make([]int, 0, len(fresh))
		for _, i := range fresh {
			if found[keys[i]] {
				out[i] = Existing
			} else {
				next = append(next, i)
			}
		}
		if len(next) == 0 {
			return nil
		}
		if len(next) == len(fresh) {
			// A duplicate that the read cannot match: a key equal only
			// under the column's collation, or a collision on another
			// unique index.
			return b.mysqlOneByOne(ctx, q, rows, next, out)
		}
		fresh = next
	}
}

// mysqlExisting returns the keys of rows[idx...] that the table holds, as
// the database returns them: a key stored in another form (another case
// in a case-insensitive column) is not among them.
func (b *batch) mysqlExisting(ctx context.Context, q Querier, rows [][]any, idx []int) (map[string]bool, error) {
	key := b.cols[b.key]
	var sb strings.Builder
	sb.WriteString("SELECT " + key + " FROM " + b.table + " WHERE " + key + " IN (")
	args := make([]any, len(idx))
	for n, i := range idx {
		if n > 0 {
			sb.WriteString(", ")
		}
		sb.WriteByte('?')
		args[n] = rows[i][b.key]
	}
	sb.WriteByte(')')
	if b.inTx {
		// Under REPEATABLE READ a plain read sees the transaction's
		// snapshot; a locking read sees the latest committed rows.
		sb.WriteString(" LOCK IN SHARE MODE")
	}
	rs, err := q.QueryContext(ctx, sb.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("read existing keys: %w", err)
	}
	defer rs.Close()
	found := map[string]bool{}
	for rs.Next() {
		var k string
		if err := rs.Scan(&k); err != nil {
			return nil, fmt.Errorf("read existing keys: %w", err)
		}
		found[k] = true
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("read existing keys: %w", err)
	}
	return found, rs.Close()
}

// mysqlOneByOne inserts rows[idx...] one by one; a duplicate is read back
// by its key under the column's collation, up to b.attempts times.
func (b *batch) mysqlOneByOne(ctx context.Context, q Querier, rows [][]any, idx []int, out []Outcome) error {
	key := b.cols[b.key]
	exists := "SELECT COUNT(*) FROM " + b.table + " WHERE " + key + " = ?"
	if b.inTx {
		exists += " LOCK IN SHARE MODE"
	}
	for _, i := range idx {
		query, args := b.insertSQL(rows, []int{i})
		var dup error
		for range b.attempts {
			_, err := q.ExecContext(ctx, query, args...)
			if err == nil {
				out[i] = Created
				break
			}
			if !IsDuplicate(err) {
				return fmt.Errorf("rows[%d]: %w", i, err)
			}
			dup = err
			var n int
			if err := q.QueryRowContext(ctx, exists, rows[i][b.key]).Scan(&n); err != nil {
				return fmt.Errorf("rows[%d]: read after a duplicate: %w", i, err)
			}
			if n > 0 {
				out[i] = Existing
				break
			}
		}
		if out[i] == NotWritten {
			return fmt.Errorf("rows[%d]: %w", i, &UnresolvedError{Attempts: b.attempts, Tx: b.inTx, Err: dup})
		}
	}
	return nil
}
