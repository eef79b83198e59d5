// Package dbosbench compares the cost of one checkpointed step of a
// multi-step operation on PostgreSQL: idem's steps, DBOS Transact's steps
// and transactions (github.com/dbos-inc/dbos-transact-golang), and the same
// insert without any checkpoint. It holds benchmarks only (see README.md).
//
// It is a module of its own, outside the repository's go.work, so that
// DBOS's dependencies are never built by CI or pulled into another module.
// Run it with GOWORK=off.
package dbosbench
