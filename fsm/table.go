package fsm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem/sqldialect"
)

// Default column names of TableConfig.
const (
	DefaultID      = "id"
	DefaultStatus  = "status"
	DefaultVersion = "version"
)

// TableConfig binds a Machine to a table. Identifiers are written into the
// SQL as they are, unquoted: each must be a plain identifier (a letter or
// '_', then letters, digits and '_', at most 63 bytes), and Table may be
// qualified by a schema ("shop.orders"). A name the database reserves
// ("order") is refused by the database, not here; rename or choose another.
type TableConfig struct {
	// Dialect is the database's SQL family: a sqldialect.Family
	// (sqldialect.PostgreSQL, MySQL, SQLite) or a store's dialect that
	// names one (sqlstore.PostgreSQL). Required.
	//
	// On MySQL and MariaDB the new version comes back through
	// LAST_INSERT_ID(expr), which also sets the connection's
	// LAST_INSERT_ID(): after a transition, SQL that reads
	// LAST_INSERT_ID() (INSERT INTO items (order_id) VALUES
	// (LAST_INSERT_ID())) reads the new version, not the id of the row
	// inserted before. Take an auto-increment id from its INSERT's
	// sql.Result.LastInsertId, or use it before the transition.
	Dialect sqldialect.Dialect
	// Table is the table's name. Required.
	Table string
	// ID is the column that identifies a row: its primary key, or a
	// column with a unique index. Empty means DefaultID ("id"). Pass ids of
	// the column's type: MySQL compares a string column with a number as
	// numbers, so 42 matches '42', '042' and '42abc' alike.
	ID string
	// Status is the column holding the state (a text column). Empty means
	// DefaultStatus ("status"). Under MariaDB's sql_mode
	// PAD_CHAR_TO_FULL_LENGTH a CHAR(n) column is read with its padding
	// and matches no state: use VARCHAR there.
	Status string
	// Version is an integer column incremented by every transition (start
	// it at 0 or 1 when a row is created). Empty means DefaultVersion
	// ("version").
	Version string
}

// A Table moves the rows of one table through a Machine's transitions.
// Build it with NewTable; it is safe for concurrent use.
type Table struct {
	m                          *Machine
	dialect                    sqldialect.Family
	table, id, status, version string
	selectQuery                string // the read after a refused UPDATE
	statusCmp                  string // the status column, compared byte for byte
	nowExpr                    string
	reserved                   map[string]bool // columns Set may not touch
}

// NewTable returns a Table for m and cfg. It refuses a nil machine or
// config, an unknown dialect, a missing table name, a malformed identifier
// and two roles given to one column.
func NewTable(m *Machine, cfg *TableConfig) (*Table, error) {
	if m == nil {
		return nil, errors.New("fsm: NewTable needs a Machine")
	}
	if cfg == nil {
		return nil, errors.New("fsm: NewTable needs a TableConfig with a Dialect and a Table")
	}
	if cfg.Dialect == nil {
		return nil, errors.New("fsm: TableConfig.Dialect is required (e.g. sqldialect.PostgreSQL or sqlstore.PostgreSQL)")
	}
	t := &Table{m: m, dialect: cfg.Dialect.Family(), table: cfg.Table, id: cfg.ID, status: cfg.Status, version: cfg.Version}
	switch t.dialect {
	case sqldialect.PostgreSQL:
		t.nowExpr = "now()"
	case sqldialect.MySQL:
		t.nowExpr = "CURRENT_TIMESTAMP(6)"
	case sqldialect.SQLite:
		t.nowExpr = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
	default:
		return nil, fmt.Errorf("fsm: TableConfig.Dialect: unknown SQL family %v", t.dialect)
	}
	if t.table == "" {
		return nil, errors.New("fsm: TableConfig.Table is required")
	}
	parts := strings.Split(t.table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("fsm: TableConfig.Table %q: at most one '.' (schema.table)", t.table)
	}
	for _, p := range parts {
		if err := checkIdent(p); err != nil {
			return nil, fmt.Errorf("fsm: TableConfig.Table: %w", err)
		}
	}
	for _, c := range []struct {
		field string
		col   *string
		def   string
	}{{"ID", &t.id, DefaultID}, {"Status", &t.status, DefaultStatus}, {"Version", &t.version, DefaultVersion}} {
		if *c.col == "" {
			*c.col = c.def
		}
		if err := checkIdent(*c.col); err != nil {
			return nil, fmt.Errorf("fsm: TableConfig.%s: %w", c.field, err)
		}
	}
	t.reserved = map[string]bool{}
	for _, c := range []string{t.id, t.status, t.version} {
		if t.reserved[strings.ToLower(c)] {
			return nil, fmt.Errorf("fsm: TableConfig: column %q has two roles", c)
		}
		t.reserved[strings.ToLower(c)] = true
	}
	// The UPDATE compares the status byte for byte, whatever the column's
	// collation (MySQL's default ones ignore case, accents and trailing
	// spaces: 'paid' = 'PAID'; SQLite's NOCASE ignores case; PostgreSQL's
	// citext and nondeterministic collations too), so that a row moves
	// only from a state the machine declares. The read after a refused
	// UPDATE reads the value the same way: PostgreSQL pads a CHAR(n)
	// column with spaces, which a cast to text removes.
	readStatus := t.status
	switch t.dialect {
	case sqldialect.PostgreSQL:
		t.statusCmp = t.status + `::text COLLATE "C"`
		readStatus = t.status + "::text"
	case sqldialect.MySQL:
		t.statusCmp = "CAST(CONVERT(" + t.status + " USING utf8mb4) AS BINARY)"
	case sqldialect.SQLite:
		t.statusCmp = t.status + " COLLATE BINARY"
	}
	t.selectQuery = "SELECT " + readStatus + ", " + t.version + " FROM " + t.table + " WHERE " + t.id + " = " + t.placeholder(1)
	if t.dialect == sqldialect.MySQL {
		// Under REPEATABLE READ a plain read in a transaction sees the
		// transaction's snapshot, older than the row the UPDATE was refused
		// on; a locking read sees the latest committed row.
		t.selectQuery += " LOCK IN SHARE MODE"
	}
	return t, nil
}

// checkIdent refuses anything but a plain SQL identifier.
func checkIdent(s string) error {
	if s == "" || len(s) > 63 || '0' <= s[0] && s[0] <= '9' {
		return fmt.Errorf("%q is not a plain identifier (a letter or '_', then letters, digits and '_', at most 63 bytes)", s)
	}
	for i := 0; i < len(s); i++ {
		if !isIdentByte(s[i]) {
			return fmt.Errorf("%q is not a plain identifier (a letter or '_', then letters, digits and '_', at most 63 bytes)", s)
		}
	}
	return nil
}

// Machine returns the table's machine.
func (t *Table) Machine() *Machine { return t.m }

// placeholder returns the n-th (from 1) placeholder of the dialect.
func (t *Table) placeholder(n int) string {
	if t.dialect == sqldialect.PostgreSQL {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// A Querier runs statements: *sql.DB, *sql.Tx and *sql.Conn implement it.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Result is what a transition did.
type Result struct {
	// Previous is the state the row left, when it is known without
	// another read: the transition had one possible source. It is empty
	// otherwise, and when AlreadyApplied.
	Previous State
	// To is the state the row is in now.
	To State
	// Version is the row's version now: the new one after a transition,
	// the current one when AlreadyApplied.
	Version int64
	// AlreadyApplied reports that the row was already in To, so this call
	// changed nothing: an earlier call (a retry's first attempt, or a
	// concurrent caller) made the transition. The caller must not repeat
	// the transition's side effects.
	AlreadyApplied bool
}

// An Option changes one call of Transition or Fire.
type Option func(*call)

// call is a transition's options.
type call struct {
	version    int64
	hasVersion bool
	sets       []set
}

type set struct {
	col string
	val any
	now bool
}

// IfVersion makes the transition conditional on the row's version being v
// (optimistic locking): a row in a legal source state with another version
// answers a *ConflictError.
func IfVersion(v int64) Option {
	return func(c *call) { c.version, c.hasVersion = v, true }
}

// Set also sets column to value, in the same UPDATE: the column changes
// if, and only if, the transition is made. column must be a plain
// identifier other than the table's id, status and version columns.
func Set(column string, value any) Option {
	return func(c *call) { c.sets = append(c.sets, set{col: column, val: value}) }
}

// SetNow sets column to the database's current time in the same UPDATE:
// now() on PostgreSQL (the transaction's start), CURRENT_TIMESTAMP(6) on
// MySQL, and on SQLite the UTC text 'YYYY-MM-DD HH:MM:SS.SSS'.
func SetNow(column string) Option {
	return func(c *call) { c.sets = append(c.sets, set{col: column, now: true}) }
}

// Transition moves the row whose id column equals id to the state to, from
// any state that a declared transition leads from to to, in one
// conditional statement. It names a target; Fire names a transition. Use
// Transition where the caller knows where the row must go whatever it is
// in (a payment callback: PAID), and Fire where the move is one edge of
// the declaration (a "cancel" that only a WAIT_PAY order may take):
//
//	UPDATE table SET status = to, version = version + 1 [, Set columns]
//	WHERE id = ? AND status IN (sources) [AND version = IfVersion]
//
// The status is compared byte for byte, whatever the column's collation
// (status::text COLLATE "C" on PostgreSQL, the column converted to
// utf8mb4 and cast to BINARY on MySQL, COLLATE BINARY on SQLite).
//
// When no row is updated, it reads the row (a locking read on MySQL) and
// answers:
//
//   - already in to: success, with Result.AlreadyApplied (whatever its
//     version; IfVersion does not turn that into a conflict);
//   - in another state that has no transition to to: an
//     *IllegalTransitionError, errors.Is ErrIllegal, naming that state
//     (Current) and the states to is allowed from (Allowed);
//   - in a legal source state: a *ConflictError, errors.Is ErrConflict —
//     its version is not IfVersion's, or it changed between the statement
//     and the read;
//   - no row: ErrNotFound.
//
// An unknown state to answers an error that wraps ErrUnknownState; a
// state no transition leads to, an *IllegalTransitionError whose
// CurrentKnown is false; neither runs a statement. Errors of the database are returned wrapped: on PostgreSQL in
// a REPEATABLE READ or SERIALIZABLE transaction, a row updated by another
// transaction since the snapshot gives SQLSTATE 40001
// (serialization_failure): retry the whole transaction.
func (t *Table) Transition(ctx context.Context, q Querier, id any, to State, opts ...Option) (Result, error) {
	if !t.m.states[to] {
		return Result{}, fmt.Errorf("%w %q", ErrUnknownState, to)
	}
	return t.run(ctx, q, id, to, t.m.sources[to], opts)
}

// Fire makes the transition named name: the row moves to its target from
// its declared sources only, even where another transition leads to the
// same target from elsewhere. It answers as Transition does (its
// IllegalTransitionError's Allowed are the transition's sources). An
// unknown name answers an error that wraps ErrUnknownTransition.
func (t *Table) Fire(ctx context.Context, q Querier, id any, name string, opts ...Option) (Result, error) {
	tr, ok := t.m.byName[name]
	if !ok {
		return Result{}, fmt.Errorf("%w %q", ErrUnknownTransition, name)
	}
	return t.run(ctx, q, id, tr.To, tr.From, opts)
}

// run makes the transition to to from one of legal.
func (t *Table) run(ctx context.Context, q Querier, id any, to State, legal []State, opts []Option) (Result, error) {
	var c call
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	sources := legal
	if len(sources) == 0 {
		return Result{}, &IllegalTransitionError{ID: id, Target: to}
	}
	query, args, err := t.update(to, sources, &c, id)
	if err != nil {
		return Result{}, err
	}
	res := Result{To: to}
	if len(sources) == 1 {
		res.Previous = sources[0]
	}

	for attempt := 1; ; attempt++ {
		r, err := t.attempt(ctx, q, id, to, sources, &c, query, args, res)
		if err == nil || attempt == aloneAttempts || !retryAlone(q, err) {
			return r, err
		}
	}
}

// aloneAttempts bounds the runs of a transition on a *sql.DB that the
// database could not serialise.
const aloneAttempts = 5

// retryAlone reports whether a transition that failed with err may simply
// run again: q is a *sql.DB, so each of its statements was a transaction
// of its own, and err is a PostgreSQL serialization failure (40001) or
// deadlock (40P01). Under a REPEATABLE READ or SERIALIZABLE session
// default an UPDATE that waited for a concurrent one fails so when that
// one commits; run again, with a new snapshot, it sees the winner's row
// and the transition answers as under READ COMMITTED. In a transaction of
// the caller's, the whole transaction must run again: the error is
// returned.
func retryAlone(q Querier, err error) bool {
	if _, ok := q.(*sql.DB); !ok {
		return false
	}
	var state interface{ SQLState() string }
	if !errors.As(err, &state) {
		return false
	}
	code := state.SQLState()
	return code == "40001" || code == "40P01"
}

// attempt runs the transition's UPDATE and, when it changed no row,
// explain.
func (t *Table) attempt(ctx context.Context, q Querier, id any, to State, sources []State, c *call, query string, args []any, res Result) (Result, error) {
	var updated bool
	if t.dialect == sqldialect.MySQL {
		r, err := q.ExecContext(ctx, query, args...)
		if err != nil {
			return Result{}, t.dbError(id, to, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return Result{}, t.dbError(id, to, err)
		}
		if n > 1 {
			return Result{}, fmt.Errorf("fsm: %s: %d rows have %s = %v, and the UPDATE changed them all (roll the transaction back); the id column must be unique", t.table, n, t.id, id)
		}
		if updated = n == 1; updated {
			if res.Version, err = r.LastInsertId(); err != nil {
				return Result{}, t.dbError(id, to, err)
			}
		}
	} else {
		switch err := q.QueryRowContext(ctx, query, args...).Scan(&res.Version); {
		case err == nil:
			updated = true
		case !errors.Is(err, sql.ErrNoRows):
			return Result{}, t.dbError(id, to, err)
		}
	}
	if updated {
		return res, nil
	}
	return t.explain(ctx, q, id, to, sources, c)
}

// explain reads the row that the UPDATE did not change, and says why.
func (t *Table) explain(ctx context.Context, q Querier, id any, to State, sources []State, c *call) (Result, error) {
	var (
		status  string
		version int64
	)
	err := q.QueryRowContext(ctx, t.selectQuery, id).Scan(&status, &version)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Result{}, fmt.Errorf("%w: %s %s = %v", ErrNotFound, t.table, t.id, id)
	case err != nil:
		return Result{}, t.dbError(id, to, err)
	}
	cur := State(status)
	switch {
	case cur == to:
		return Result{To: to, Version: version, AlreadyApplied: true}, nil
	case !slices.Contains(sources, cur):
		return Result{}, &IllegalTransitionError{ID: id, Current: cur, CurrentKnown: true, Target: to, Allowed: slices.Clone(sources), Version: version}
	default:
		e := &ConflictError{ID: id, Current: cur, Target: to, Version: version}
		if c.hasVersion {
			e.Expected, e.HasExpected = c.version, true
		}
		return Result{}, e
	}
}

func (t *Table) dbError(id any, to State, err error) error {
	return fmt.Errorf("fsm: %s %s = %v to %s: %w", t.table, t.id, id, to, err)
}

// update returns the conditional UPDATE of a transition and its arguments.
func (t *Table) update(to State, sources []State, c *call, id any) (string, []any, error) {
	var (
		b    strings.Builder
		args = make([]any, 0, 3+len(sources)+len(c.sets))
	)
	arg := func(v any) string {
		args = append(args, v)
		return t.placeholder(len(args))
	}
	b.WriteString("UPDATE " + t.table + " SET " + t.status + " = " + arg(string(to)) + ", " + t.version + " = ")
	if t.dialect == sqldialect.MySQL {
		// The new version comes back as the result's LastInsertId.
		b.WriteString("LAST_INSERT_ID(" + t.version + " + 1)")
	} else {
		b.WriteString(t.version + " + 1")
	}
	seen := map[string]bool{}
	for _, s := range c.sets {
		if err := checkIdent(s.col); err != nil {
			return "", nil, fmt.Errorf("fsm: Set: %w", err)
		}
		low := strings.ToLower(s.col)
		if t.reserved[low] {
			return "", nil, fmt.Errorf("fsm: Set: column %q is the table's id, status or version", s.col)
		}
		if seen[low] {
			return "", nil, fmt.Errorf("fsm: Set: column %q is set twice", s.col)
		}
		seen[low] = true
		if s.now {
			b.WriteString(", " + s.col + " = " + t.nowExpr)
		} else {
			b.WriteString(", " + s.col + " = " + arg(s.val))
		}
	}
	b.WriteString(" WHERE " + t.id + " = " + arg(id) + " AND " + t.statusCmp)
	if len(sources) == 1 {
		b.WriteString(" = " + arg(string(sources[0])))
	} else {
		b.WriteString(" IN (")
		for i, s := range sources {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(arg(string(s)))
		}
		b.WriteString(")")
	}
	if c.hasVersion {
		b.WriteString(" AND " + t.version + " = " + arg(c.version))
	}
	if t.dialect != sqldialect.MySQL {
		b.WriteString(" RETURNING " + t.version)
	}
	return b.String(), args, nil
}
