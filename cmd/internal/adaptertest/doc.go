// Package adaptertest holds tests of the broker adapters (natsjs,
// rabbitmq) that need more than the adapters' own modules depend on: the
// inbox's external-effect mode (Handle) through both brokers with the SQL
// inbox store on PostgreSQL and with the Redis inbox store. The package
// has no code of its own; see its tests.
package adaptertest
