package sqlstore

// SQLiteDSN exposes the DSN of OpenSQLite to the benchmarks that compare
// connection settings.
var SQLiteDSN = sqliteDSN
