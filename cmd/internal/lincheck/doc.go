// Package lincheck checks histories of real calls to idem's stores for
// linearizability, with github.com/anishathalye/porcupine: many clients
// call a store at once, every call is recorded with when it started and
// when it returned, and the checker searches for one order of the calls,
// consistent with real time, in which a sequential model of the contract
// gives every answer the store gave. A history with no such order is a
// defect, whatever the example-based tests say.
//
// The model of the Store contract (see StoreModel) follows the record of
// one key: its owner and fence, its lease and expiry on the store's
// clock, its completion. Time is not simulated: a call's instant is
// somewhere in its [call, return] window on the machine's clock (the
// servers run on loopback, on the same clock), so a lease or a retention
// that ends inside that window, within Margin, may have ended or not, and
// the model accepts both. A call that failed (a dropped connection, a
// timeout) may or may not have taken effect, at any time after it began:
// the model accepts both, with what it left unknown (the owner of a lease
// nobody received) learnt from later answers.
//
// Run drives a store with a random workload from several goroutines and
// returns the history; Check checks it and, on failure, writes porcupine's
// visualisation next to the test's artifacts. The tests of this package
// run the workload on every store, lock backend and token store, on
// loopback servers directly and through internal/netfault's proxy while
// it injects faults.
package lincheck
