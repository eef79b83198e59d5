package uniq

import (
	"errors"
	"reflect"
)

// Codes that mean "duplicate key" in the drivers IsDuplicate knows.
const (
	// sqlStateUniqueViolation is PostgreSQL's unique_violation.
	sqlStateUniqueViolation = "23505"

	// MySQL and MariaDB: ER_DUP_ENTRY ("Duplicate entry '%s' for key %d")
	// and ER_DUP_ENTRY_WITH_KEY_NAME ("Duplicate entry '%s' for key '%s'").
	mysqlDupEntry            = 1062
	mysqlDupEntryWithKeyName = 1586

	// SQLite's extended result codes: SQLITE_CONSTRAINT_PRIMARYKEY,
	// SQLITE_CONSTRAINT_UNIQUE and SQLITE_CONSTRAINT_ROWID.
	sqlitePrimaryKey = 1555
	sqliteUnique     = 2067
	sqliteRowID      = 2579
)

// IsDuplicate reports whether err, or any error it wraps (through Unwrap()
// error and Unwrap() []error, as errors.As walks them), is a unique
// violation: an INSERT or UPDATE refused because a unique index, a unique
// constraint or a primary key already holds the value. Other constraint
// violations (foreign key, not null, check, exclusion) are not duplicates.
//
// It recognises, without importing any driver:
//
//   - PostgreSQL through pgx v5 (*pgconn.PgError) and lib/pq (*pq.Error),
//     and any error with a method SQLState() string: SQLSTATE 23505
//     (unique_violation). Versions of lib/pq without SQLState are
//     recognised by their type (github.com/lib/pq.Error) and its Code field.
//   - MySQL and MariaDB through go-sql-driver/mysql (*mysql.MySQLError):
//     error number 1062 (ER_DUP_ENTRY) or 1586 (ER_DUP_ENTRY_WITH_KEY_NAME),
//     read from its Number field. MySQL's SQLSTATE 23000 covers every
//     integrity error, so it is not used.
//   - SQLite through modernc.org/sqlite (*sqlite.Error, its Code method)
//     and mattn/go-sqlite3 (sqlite3.Error, its ExtendedCode field): the
//     extended result codes SQLITE_CONSTRAINT_UNIQUE (2067),
//     SQLITE_CONSTRAINT_PRIMARYKEY (1555) and SQLITE_CONSTRAINT_ROWID
//     (2579). The plain SQLITE_CONSTRAINT (19) says only that some
//     constraint failed, so it is not a duplicate.
//
// A driver's type is identified by its package path and type name, and its
// code read from an exported field or method; the error's message is never
// parsed.
func IsDuplicate(err error) bool {
	var sp *rollbackError
	if errors.As(err, &sp) {
		return false // the transaction is gone: nothing to read
	}
	return walk(err, isDuplicateOne)
}

// isPostgres reports whether err, or an error it wraps, comes from a
// PostgreSQL driver: it has a SQLState method (pgx, lib/pq), or is lib/pq's
// Error.
func isPostgres(err error) bool {
	return walk(err, func(err error) bool {
		if _, ok := err.(interface{ SQLState() string }); ok {
			return true
		}
		t := reflect.TypeOf(err)
		if t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		return t != nil && t.PkgPath() == "github.com/lib/pq" && t.Name() == "Error"
	})
}

// walk reports whether f holds for err or for an error in its tree, in the
// order errors.As visits them.
func walk(err error, f func(error) bool) bool {
	for err != nil {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if walk(e, f) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// isDuplicateOne looks at err alone, not at what it wraps.
func isDuplicateOne(err error) bool {
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer {
		// A typed nil (*pgconn.PgError)(nil): its methods would panic.
		if v.IsNil() {
			return false
		}
		v = v.Elem()
	}
	if s, ok := err.(interface{ SQLState() string }); ok {
		return s.SQLState() == sqlStateUniqueViolation
	}
	if v.Kind() != reflect.Struct {
		return false
	}
	t := v.Type()
	for _, d := range drivers {
		if t.PkgPath() == d.pkg && t.Name() == d.name {
			return d.dup(err, v)
		}
	}
	return false
}

// A driverError identifies one driver's error type and reads its code.
type driverError struct {
	pkg, name string
	// dup reports whether the error (err, and v the struct it is or points
	// to) is a duplicate.
	dup func(err error, v reflect.Value) bool
}

// drivers are the error types recognised by type rather than by an
// SQLState method.
var drivers = []driverError{
	{"github.com/go-sql-driver/mysql", "MySQLError", func(_ error, v reflect.Value) bool {
		n, ok := uintField(v, "Number")
		return ok && (n == mysqlDupEntry || n == mysqlDupEntryWithKeyName)
	}},
	{"modernc.org/sqlite", "Error", func(err error, _ reflect.Value) bool {
		c, ok := err.(interface{ Code() int })
		return ok && isSQLiteDuplicate(int64(c.Code()))
	}},
	{"github.com/mattn/go-sqlite3", "Error", func(_ error, v reflect.Value) bool {
		c, ok := intField(v, "ExtendedCode")
		return ok && isSQLiteDuplicate(c)
	}},
	// lib/pq before SQLState existed: Code is an ErrorCode (a string).
	{"github.com/lib/pq", "Error", func(_ error, v reflect.Value) bool {
		f := v.FieldByName("Code")
		return f.IsValid() && f.Kind() == reflect.String && f.String() == sqlStateUniqueViolation
	}},
}

func isSQLiteDuplicate(code int64) bool {
	return code == sqliteUnique || code == sqlitePrimaryKey || code == sqliteRowID
}

// uintField returns the value of v's exported field name, of an unsigned
// or signed integer kind.
func uintField(v reflect.Value, name string) (uint64, bool) {
	f := v.FieldByName(name)
	if !f.IsValid() {
		return 0, false
	}
	switch {
	case f.CanUint():
		return f.Uint(), true
	case f.CanInt() && f.Int() >= 0:
		return uint64(f.Int()), true
	}
	return 0, false
}

// intField returns the value of v's exported field name, of a signed or
// unsigned integer kind.
func intField(v reflect.Value, name string) (int64, bool) {
	f := v.FieldByName(name)
	if !f.IsValid() {
		return 0, false
	}
	switch {
	case f.CanInt():
		return f.Int(), true
	case f.CanUint() && f.Uint() <= 1<<62:
		return int64(f.Uint()), true
	}
	return 0, false
}

// errorsIsAny reports whether err matches one of targets.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
