package sqldialect

import "strconv"

// A Dialect is anything that names its SQL family: a [Family], or a
// store's dialect (sqlstore.PostgreSQL and its siblings).
type Dialect interface {
	// Family returns the SQL family the dialect speaks.
	Family() Family
}

// A Family is a family of SQL servers that share placeholders, clock
// functions and locking reads. It is a [Dialect] of itself.
type Family uint8

// The families idem writes SQL for. The zero Family is none of them.
const (
	// PostgreSQL: $1 placeholders, RETURNING, now().
	PostgreSQL Family = iota + 1
	// MySQL and MariaDB: ? placeholders, CURRENT_TIMESTAMP(6), LOCK IN
	// SHARE MODE.
	MySQL
	// SQLite 3.35 or later: ? placeholders, RETURNING.
	SQLite
)

// Family returns f: a Family is its own Dialect.
func (f Family) Family() Family { return f }

// Valid reports whether f is one of PostgreSQL, MySQL and SQLite.
func (f Family) Valid() bool { return f >= PostgreSQL && f <= SQLite }

// String returns the family's name ("PostgreSQL", "MySQL", "SQLite"), or
// "Family(n)" for another value.
func (f Family) String() string {
	switch f {
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	case SQLite:
		return "SQLite"
	}
	return "Family(" + strconv.Itoa(int(f)) + ")"
}

// Of returns d's family, or 0 (no family) when d is nil.
func Of(d Dialect) Family {
	if d == nil {
		return 0
	}
	return d.Family()
}
