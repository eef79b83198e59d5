// Package rabbitmqtest holds the rabbitmq adapter's consumer tests with
// an inbox on a SQL store: HandleTx on SQLite and PostgreSQL against the
// machine's RabbitMQ (duplicates, retries on classic and quorum queues,
// dead letters, cut connections, a consumer or a relay killed mid-way,
// two consumer processes), and the benchmarks. They live in cmd, which
// depends on every module, so that the rabbitmq module requires neither
// sqlstore nor its drivers. The package has no code of its own; see its
// tests.
package rabbitmqtest
