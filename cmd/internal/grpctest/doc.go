// Package grpctest holds the tests of [github.com/idemkit/idem/idemgrpc]
// over real stores (sqlstore on SQLite and PostgreSQL). They live in the
// cmd module so that the idemgrpc module requires no SQL driver. The
// package has no code of its own.
package grpctest
