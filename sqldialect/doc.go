// Package sqldialect names the family of SQL a database server speaks, so
// that one value says "PostgreSQL" to every package of idem that writes
// SQL: fsm's TableConfig.Dialect takes a [Dialect], which both this
// package's [Family] values and sqlstore's dialects (sqlstore.PostgreSQL,
// sqlstore.MySQL, sqlstore.SQLite) implement. A program that uses sqlstore
// passes its dialect everywhere; one that does not passes
// sqldialect.PostgreSQL and imports no driver or store.
//
// It imports the standard library only.
//
// # Conventions
//
// A package that writes SQL takes a [Dialect] (an interface with the one
// method Family), not a type of its own, and switches on the [Family]
// it returns; a value of another family, or a nil Dialect, is refused
// with an error naming the field.
package sqldialect
