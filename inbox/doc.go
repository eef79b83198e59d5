// Package inbox makes a message consumer's effects happen once, however
// often a broker delivers the message: a consume record per (message ID,
// consumer group), written succeeded only after the effect.
//
// Queues deliver at least once: a consumer that crashes after its effect
// and before its ack gets the message again; a producer that timed out
// publishes twice; a failover redelivers. Inbox.HandleTx claims the
// message's record, runs the handler's effect and marks the record
// succeeded in one SQL transaction, so the effect and the record commit
// together or not at all; a redelivery then finds the record succeeded
// and answers Duplicate. Inbox.Handle is the mode for effects outside the
// database (a call to another service): the claim commits first, with a
// lease and a fence, the handler gets the fence and the message ID (the
// idempotency key of its downstream call), and Finish presents the fence.
//
// Every call answers an Outcome whose Result a broker adapter maps to an
// action: Processed and Duplicate → ack; Retry → nak / requeue after
// Outcome.Delay; Dead → terminate / dead-letter; InProgress (another
// consumer holds the message's lease) → nak after Outcome.Delay.
//
// # The consumer loop
//
// Consumer is the consumer protocol, once for every broker: an adapter
// (natsjs, rabbitmq, or an adopter's) receives its broker's deliveries,
// wraps each as a BrokerDelivery and hands it to Consumer.Settle, which
// runs the Process (Inbox.ProcessTx or Inbox.Process) and settles the
// delivery. The consumertest package is the conformance suite an adapter
// passes over its real broker. The loop guarantees:
//
//   - A store error (the Process returned an error) is not a failed
//     attempt: the delivery is held (InProgress every
//     ConsumerConfig.Heartbeat) and the Process called again after a
//     growing, bounded backoff (100 ms doubling to 10 s, jittered), until
//     it gives an outcome or the consumer stops (the delivery is then
//     naked with DefaultStopNak). A store outage costs time, never a
//     delivery nor an attempt.
//   - A panic of the Process, or of the handler inside it, is a Retry
//     (a handler's counts as a failed attempt), never the consumer's end.
//   - A dead message is dead-lettered (DeadLetter, retried with the
//     backoff while the delivery is held) and only then terminated: it
//     ends handled or dead-lettered, never neither, as long as the
//     broker redelivers a message that was naked.
//   - A Retry on the ConsumerConfig.MaxDeliver-th delivery (by the
//     broker's count) is dead-lettered; an InProgress never is (another
//     consumer holds the message's live lease and settles it).
//   - A message without an ID gets one from ConsumerConfig.DeriveFrom
//     (its business number, event type and version), else the broker's
//     fallback.
//
// It does not: cancel a Process that hangs (a store that black-holes
// its connections holds the delivery, heartbeating, until the network
// or the driver gives up); tell a store outage from a Process that
// returns an error for ever (a misuse, such as HandleTx over a store
// without TxStore, holds its delivery until the consumer stops: every
// retry is logged); nor order deliveries. In Handle's mode, a Finish
// that failed leaves the claim's lease held: the retry finds it
// InProgress and the delivery is naked until the lease ends, when a
// redelivery takes the message over (and runs the handler again).
//
// Stores: MemoryStore (this package, one process; no HandleTx), the
// sqlstore package's InboxStore (PostgreSQL, MySQL/MariaDB, SQLite; with
// TxStore, for HandleTx), and the redisstore package's InboxStore (for
// Handle). The inboxtest package is the conformance suite every store
// passes.
//
// # What it guarantees
//
//   - One record per (message ID, group); a record is processing,
//     succeeded, failed or dead, with an attempt count, a fence (+1 on
//     every claim) and a lease, all decided on the store's clock.
//   - With HandleTx, the effect commits if and only if the record commits
//     succeeded: of any number of deliveries of one message, concurrent or
//     not, in one process or many, one effect commits. A concurrent
//     delivery waits for the transaction holding the record.
//   - A failed message is retried, never dropped as a duplicate: a
//     handler's error (or panic) releases the record as failed, and the
//     next delivery runs the handler again — until Config.MaxAttempts
//     attempts, after which the record is dead and every delivery answers
//     Dead.
//   - With Handle, a holder whose lease ended and was taken over by
//     another delivery (a higher fence) cannot finish or fail the record
//     (ErrFenced), and its handler's context is cancelled with cause
//     ErrLeaseLost when a renewal is refused, or when no renewal
//     confirmed the lease before it may have ended (a renewal that fails
//     or times out is retried soon after, within what remains of it).
//   - A message without an ID gets one derived from the fields
//     Config.DeriveFrom names (DeriveID); without it, or when one of
//     those fields is empty, the message is Dead with ErrNoID and no
//     record is written.
//
// # What it does not guarantee
//
//   - Handle guarantees the record, not the external effect: a process
//     that dies after its downstream call and before Finish leaves the
//     call made, and the takeover makes it again. Give the downstream the
//     message ID as its idempotency key, or the fence to refuse stale
//     holders.
//   - HandleTx's attempts count handler errors: a process that dies inside
//     the transaction rolls the claim back with the effect, and that
//     attempt is not counted (a message that kills its consumer is never
//     dead by count; the broker's own delivery limit must catch it).
//   - Records do not stay forever: Sweep removes succeeded, dead and
//     failed records after a retention, and processing records whose
//     lease ended more than the retention ago (their consumer died and the
//     message never came back); the Redis store also expires succeeded
//     and dead records by itself. A delivery of a message whose record
//     was swept is handled as a new message: a duplicate runs its effect
//     again, and a failed or dead message's attempts count from 1 again.
//     Keep the retention longer than the broker may redeliver, and far
//     longer than a handler may outlive its lease (see Inbox.Sweep).
//   - An error from the store leaves the record's state unknown; the
//     Outcome is Retry, and a later call settles it (the consumer loop
//     calls again in place, holding the delivery).
//   - It does not order messages: that is the broker's and the adapter's
//     concern.
package inbox
