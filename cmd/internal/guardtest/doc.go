// Package guardtest holds the tests, examples and benchmarks of
// [github.com/idemkit/idem/uniq] and [github.com/idemkit/idem/fsm] that need
// real databases (PostgreSQL through pgx and lib/pq, MySQL/MariaDB,
// SQLite). They live in the cmd module so that the root module, where
// those packages are, requires no driver. The package has no code of its
// own.
package guardtest
