// Package shop is idem's reference service: a small shop whose effects must
// happen once however often a client retries.
//
// Version 1 serves orders:
//
//	POST /orders              create an order (Idempotency-Key required)
//	GET  /orders/{order_no}   one of the caller's orders
//	GET  /orders              the caller's orders, newest first
//	GET  /healthz             liveness and database reachability
//
// The caller is identified by the X-User-ID header (a positive integer; a
// stand-in for real authentication) and that identity is the idempotency
// scope, so equal keys from different users never meet.
//
// An order row and the idempotency completion commit in one database
// transaction (idem's CompleteTx): either the order exists and every retry
// replays its 201, or neither happened and a retry creates it.
//
// # Databases
//
// The orders live in the database of the idempotency records, so that
// CompleteTx works on every backend: SQLite (the default, one file;
// several processes on one host), PostgreSQL or MySQL/MariaDB (any number
// of processes). shopd's -db flag chooses it:
//
//	sqlite:PATH                           default sqlite:<-data>/shop.db
//	postgres://user:pass@host:port/db     or postgresql://…, read by pgx
//	mysql://user:pass@host:port/db?k=v    translated into a go-sql-driver DSN; port 3306 by default, k=v are the driver's DSN parameters
//	mysql:user:pass@tcp(host:port)/db     a raw go-sql-driver DSN (unix sockets, say)
//
// -data DIR is short for -db sqlite:DIR/shop.db; giving both is an error.
// A server database gets a pool of at most 16 connections; SQLite keeps
// sqlstore.OpenSQLite's single connection. -redis redis://host:port/db
// (go-redis ParseURL syntax; rediss:// for TLS) puts Redis in front of the
// database (tieredstore): Redis answers replays and in-flight duplicates,
// the database decides, and a Redis outage only slows requests down.
//
// Each dialect has its own migrations (migrations/sqlite, migrations/postgres,
// migrations/mysql) and Migrate is safe when several processes start at once
// on one database: one SQLite write transaction; one PostgreSQL transaction
// under pg_advisory_xact_lock; on MySQL, which commits DDL statement by
// statement, GET_LOCK('idem_shop_migrate') and statements safe to rerun.
// Statements are written with ? and rebound to $n for PostgreSQL.
package shop
