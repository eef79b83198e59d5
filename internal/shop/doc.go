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
package shop
