// Package steps runs operations of several steps under one idempotency
// record, so that an effect spread over systems that share no
// transaction (a refund at a payment provider, then the order marked
// refunded and an event written) completes once, however often it is
// retried, and even when nobody retries it.
//
// An operation is a function of its input that runs named steps and
// returns an answer:
//
//	refund, _ := steps.Define(runner, "refund", func(ctx context.Context, s *steps.Run, in Refund) (Receipt, error) {
//		if _, err := steps.Local(s, "mark-refunding", func(ctx context.Context, tx *sql.Tx) (bool, error) {
//			return true, markRefunding(ctx, tx, in.Order)
//		}); err != nil {
//			return Receipt{}, err
//		}
//		re, err := steps.Foreign(s, "provider", func(ctx context.Context, key string) (ProviderRefund, error) {
//			return provider.Refund(ctx, key, in.Payment, in.Amount) // key: the Idempotency-Key to send
//		})
//		if err != nil {
//			return Receipt{}, err // a *idem.DefiniteError ("refund refused") is stored; others are retried
//		}
//		return steps.Local(s, "mark-refunded", func(ctx context.Context, tx *sql.Tx) (Receipt, error) {
//			return markRefunded(ctx, tx, in.Order, re) // and the outbox event, in tx
//		})
//	}, &steps.OpConfig[Refund, Receipt]{Key: ...})
//
// # Steps
//
// A local step (Local) runs in a transaction of the journal's database;
// its writes, its checkpoint (the step's result, encoded as JSON or by a
// Step's Codec) and a check that the run still holds its record's lease
// commit together or not at all; with Step.Retry, a transaction the
// database refused as a deadlock victim or could not serialise runs
// again within the run instead of failing its attempt. A foreign step (Foreign) calls another
// system with a key derived from the record's (idem.Lease.DeriveKey): the
// same on every run, so that the other system de-duplicates the call;
// its result is checkpointed after it returns. A run resumes after the
// last checkpoint: every step done returns its checkpointed result
// without running. A run whose key was taken over (its lease ended)
// checkpoints nothing: the journal's writes are fenced by the record.
//
// # Answers and failures
//
// The operation's answer is stored in its idempotency record as
// idem.EncodeOutcome builds it (status 200 and the result as JSON; 422
// and {"code", "message"} for an idem.DefiniteError), the same format as
// idem.Func's, with Content-Type application/json: a duplicate of the
// request gets it, over HTTP too. With a TxJournal the answer and the
// operation's end commit in one transaction. Any other error ends the
// attempt: the record is released (a client's retry resumes at once),
// the journal counts the failure and schedules the completer after a
// backoff. Until the operation is done, its key stays its own: a
// request under the key with another input or another operation, which
// the released record no longer refuses, is refused by the journal
// (idem.ErrMismatch), so that it cannot drop the operation's
// checkpoints, nor call another system under its derived keys.
//
// # The completer
//
// Operations whose run died (a crash, a lost lease) or failed, and whose
// client stopped retrying, are finished by the completer: Runner.Start
// in every instance (or Runner.Complete from a job) finds the due
// operations of the names it knows, acquires each one's key (so one
// execution at a time, fenced like any) and resumes it from its
// checkpoints. An operation that failed MaxAttempts attempts is dead:
// the completer leaves it, an operator sees it (Journal.List, Get) and
// may retry it (Runner.Retry). A client's retry still runs a dead
// operation.
//
// # Where it runs
//
// Op.Call runs an operation under an execution of its own (jobs,
// consumers, any Go code); Op.Run runs it inside the execution of an
// idemhttp or idemgrpc handler, under the request's Idempotency-Key.
// The journal is sqlstore.StepJournal (SQLite, PostgreSQL, MySQL and
// MariaDB, next to sqlstore's records: local steps need it) or Memory
// (one process, foreign steps only). stepstest is the suite a journal
// passes.
//
// # What it does not do
//
// A foreign step called by a run that died before its checkpoint is
// called again, with the same key: exactly once at the other system
// needs that system to de-duplicate by the key (payment providers do).
// On SQLite, whose one connection a local step's transaction holds, the
// watchdog cannot renew the lease while the step runs: a local step
// longer than the lease loses it and never checkpoints (nothing is
// doubled, but the operation ends dead); keep local steps shorter than
// the lease there. A run cut short by Runner.Close (a deploy) counts as
// a failed attempt. A run must ask for its steps deterministically (same names in the
// same order for the same input). The completer resumes operations in
// the instance's process: define every operation in every instance
// that runs a completer.
package steps
