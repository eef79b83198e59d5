// Package storetest is the conformance suite for [idem.Store]
// implementations. A store is done when [Run] passes against a real server:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idem.Store { return newStore(t) }, storetest.Caps{
//			BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
//			Precision: time.Millisecond,
//		})
//	}
//
// The suite pins every outcome of every operation of the contract
// documented on [idem.Store]: the outcomes of Acquire (including races of
// many goroutines on one key; an Acquired result must carry the record it
// wrote, equal field for field to what Get then returns), leases and their takeover with fence + 1,
// Complete, Extend and Release refused with [idem.ErrLeaseLost] once the
// lease is no longer the caller's, a retried completion (Complete with
// the owner and fence that completed the record returns nil and changes
// nothing; CompleteTx then fails with [idem.ErrFinished]), Get, Delete,
// DeleteIf (for a store that implements [idem.ConditionalDeleter]: it
// deletes the record read, refuses one taken over, replaced or created
// again with [idem.ErrRecordChanged], and of many racing calls exactly
// one deletes), Sweep, scope isolation,
// key validation, and byte-for-byte round trips of binary and large
// responses, header values included (any bytes: not UTF-8, NUL, empty). With [Caps].BeginTx set it also pins [idem.TxCompleter], both
// directly and through [idem.Guard].
//
// # What a store under test must allow
//
//   - newStore may return the same store, on the same server, for every
//     case: each case works in a scope of its own (random per run) and
//     tolerates records of other cases and other runs.
//   - The cases that call Sweep run first, one at a time; the other cases
//     then run in parallel. Sweep removes expired records of every scope, so
//     nothing else should sweep the store while Run runs: a concurrent sweep
//     may remove the short-lived records some cases create.
//   - Lease-expiry cases use real leases of 150 ms and sleep past them; the
//     store's clock must advance with the test's clock (skew between them of
//     up to 2 s is tolerated). The whole suite takes a few seconds.
package storetest
