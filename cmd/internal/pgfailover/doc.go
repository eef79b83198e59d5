// Package pgfailover holds the failover tests of sqlstore on PostgreSQL:
// each test starts, on loopback, a PostgreSQL primary and a streaming
// replica of its own (initdb, postgres, pg_basebackup -R; no Docker), sends
// keyed requests through the idemhttp middleware to a handler whose effect
// row commits with the stored response (Execution.CompleteTx), kills the
// primary with SIGKILL and promotes the replica, while the program reaches
// whichever server is writable through a multi-host pgx URL with
// target_session_attrs=read-write.
//
// With synchronous replication (synchronous_commit = on, the replica named
// in synchronous_standby_names) every key a client was answered 2xx for
// has exactly one effect row on the promoted server, and a replay of the
// key answers what the client got (TestSyncFailover); a commit whose
// answer died with the primary is there too, and its retry is a replay
// (TestSyncFailoverKeepsUnsureCommit). With asynchronous replication the
// promoted server may lack a commit the old primary acknowledged: the
// record and its effect are lost together, and a retry runs the handler
// again. idem's exactly-once holds only as far as the database keeps the
// commits it acknowledged; TestAsyncFailoverLosesAcknowledged shows where
// that stops.
//
// The server programs are found in IDEM_PG_BIN, Debian's
// /usr/lib/postgresql/15/bin, or PATH; without them the tests skip (or
// fail, under IDEM_REQUIRE_SERVICES=1). Run as root, the servers run as
// the postgres OS user. IDEM_FAILOVER_ROUNDS (default 1) is the number of
// failovers the synchronous test makes, back and forth, the old primary
// rebuilt each time as the new primary's replica. The tests build on
// Linux only: they find a server's processes in /proc. The package has no
// code of its own.
package pgfailover
