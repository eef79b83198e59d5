// Package tieredtest holds the tests and benchmarks of
// [github.com/idemkit/idem/tieredstore] that need a SQL truth store
// (sqlstore on SQLite, PostgreSQL and MySQL). They live in the cmd module,
// next to the other tests that combine integrations, so that the
// tieredstore module requires only the root module and go-redis: a
// tieredstore user's module graph holds no SQL driver. The package has no
// code of its own.
package tieredtest
