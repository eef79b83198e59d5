// Package natsjstest holds the natsjs adapter's tests with an inbox on a
// SQL store: HandleTx on SQLite and PostgreSQL against the machine's NATS
// server (duplicates, retries, dead letters, heartbeats, a consumer or a
// relay killed mid-way, two consumer processes, cut connections), and the
// benchmarks. They live in cmd, which depends on every module, so that
// the natsjs module requires neither sqlstore nor its drivers. The
// package has no code of its own; see its tests.
package natsjstest
