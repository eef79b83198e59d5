// Package sentinelfail holds the tests of idem on Redis through a
// Sentinel failover: a primary, replicas and three Sentinels started by
// the tests on loopback, the primary killed under load, and the program
// following the promoted replica through go-redis' failover client. The
// effect is a row in PostgreSQL with no unique constraint, so a record
// the failover loses shows as a doubled effect. The package has no code
// of its own; see its tests and the reliability page of the docs.
package sentinelfail
