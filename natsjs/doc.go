// Package natsjs connects the inbox and the outbox to NATS JetStream
// (github.com/nats-io/nats.go/jetstream): a Consumer that hands a durable
// pull consumer's messages to an inbox.Inbox and acks them by its
// outcome, and a Publisher for outbox.Relay.
//
// # Consumer
//
// NewConsumer creates (or updates) a durable pull consumer with explicit
// acks on a stream; Run pulls its messages and hands each to a Process —
// HandleTx(in, db, h) (the effect and the consume record in one SQL
// transaction) or Handle(in, h) (the external-effect mode) — with
// Config.Workers messages at once. Each message becomes an inbox.Message:
// its ID is the Nats-Msg-Id header, else the one Config.DeriveFrom
// derives (its business number, event type and version), else
// "<stream>:<stream sequence>:<timestamp>" (the stream's time of the message, in Unix
// nanoseconds: a stream created again numbers from 1 again); its
// Topic the subject, its Key the Idem-Key header, its Headers the first
// value of each header, its Payload the data. The outcome decides the
// acknowledgement, sent only after the Process returned, so after the
// commit:
//
//   - Processed, Duplicate: a double ack (AckSync), which waits for the
//     server's confirmation; unconfirmed, the redelivery is a Duplicate.
//   - Retry, InProgress: a nak with the outcome's delay (the inbox's
//     backoff, or the remainder of another consumer's lease).
//   - A store error (the Process returned an error): the message is
//     held (InProgress) and the Process called again after a growing,
//     bounded backoff (Config.Backoff), without a nak: a database
//     outage costs time, never a delivery nor an attempt.
//   - Dead (the inbox's MaxAttempts failed, or no ID): the message is
//     published to Config.DeadLetterSubject — by default
//     "idem.dead.<stream>.<durable>" — with its data, its headers (less
//     the Nats-* ones) and Idem-Dead-Reason, Idem-Dead-Id,
//     Idem-Dead-Subject, Idem-Dead-Stream, Idem-Dead-Sequence,
//     Idem-Dead-Consumer and Idem-Dead-Deliveries; once the dead letter's
//     stream confirmed it, the message is terminated (TermWithReason on
//     servers from 2.10.4, Term before: older servers ignore the reason
//     and the whole acknowledgement with it). Term alone would discard
//     the message unseen; the dead letter keeps it to be inspected and
//     published again. A stream must capture the dead-letter subject:
//     if the publish fails, it is retried with the backoff while the
//     message is held. NewConsumer refuses a dead-letter subject that
//     the consumer itself would receive (the stream's subjects and the
//     filter capture it): each dead letter would come back to it as a
//     new message, for ever; and a dead letter of its own delivered back
//     (the stream changed later: a message on the dead-letter subject)
//     is terminated, never handled. To retry a dead letter, publish it
//     again on its Idem-Dead-Subject under a new Nats-Msg-Id (the old
//     ID's inbox record is dead): it is handled as any message. The dead
//     letter's Nats-Msg-Id is "dead:<stream>:<durable>:<seq>:<timestamp>"
//     (the stream's time of the message), so two lives of a stream do
//     not collide in the dead-letter stream's Duplicates window.
//   - A Retry outcome on the Config.MaxDeliver-th delivery is
//     dead-lettered too, with a reason that says so (an InProgress is
//     naked whatever its count: the lease's holder settles the message). The limit is the
//     consumer's: the durable is created with MaxDeliver unlimited, so
//     that the server never drops a message on its last delivery whose
//     dead letter could not be published yet. Its inbox record stays
//     failed.
//
// The protocol (claim, run, record, ack, nak, dead-letter, panics, store
// errors) is the inbox's consumer loop (inbox.Consumer); this package
// translates JetStream's messages to it. JetStream guarantees the
// redelivery of a message not acked within AckWait and the stream's
// de-duplication of Nats-Msg-Id within its Duplicates window; the loop
// adds the rest.
//
// While a Process runs, the consumer sends InProgress every third of
// Config.AckWait, so that a long handler does not get its message
// redelivered to another consumer meanwhile.
//
// If its consumption ends by itself — the durable consumer was deleted
// under it, or the connection closed — Run creates the consumer again
// and consumes again (every second until that succeeds), until its
// context ends.
//
// # Publisher
//
// Publisher.Publish sends an outbox.Message on its Topic (or
// PublisherConfig.Subject's mapping) with its ID as Nats-Msg-Id
// (jetstream.WithMsgID), its Key as Idem-Key and its headers, and returns
// nil only after the stream's PubAck. A message the stream already holds
// under that ID within its Duplicates window (StreamConfig.Duplicates,
// 2 minutes by default) is acknowledged as a duplicate and not stored
// again.
//
// # What it guarantees
//
//   - With HandleTx, one committed effect per message ID and durable
//     (the inbox's group), however often JetStream delivers it: a
//     consumer killed after its commit and before its ack gets the message
//     redelivered after AckWait, and the redelivery is acked as a
//     Duplicate.
//   - A message is acked only after its Process returned Processed or
//     Duplicate, and terminated only after its dead letter was confirmed:
//     no message is dropped unseen.
//   - A message republished with the same Nats-Msg-Id (an outbox relay
//     that died after the PubAck and before marking the message sent, a
//     producer's retry) is dropped by the stream within its Duplicates
//     window, and by the consumer's inbox after it.
//   - A connection that is cut and reconnects does not end Run: JetStream
//     pulls again after the reconnect. A connection whose reconnect
//     attempts ran out is closed for good, and Run returns
//     nats.ErrConnectionClosed (connect with nats.MaxReconnects(-1) to
//     ride out any outage). A durable deleted under a running consumer is
//     created again, and delivers the stream from its start: the inbox
//     acks what it handled before as duplicates.
//   - Run returns after the messages being handled are settled; handlers
//     run with a context that Run's does not cancel, so a shutdown is not
//     counted as a failed attempt.
//
// # What it does not guarantee
//
//   - De-duplication of messages without Nats-Msg-Id beyond redeliveries:
//     their ID is the stream sequence, which a re-publish changes.
//     Publish with an ID (the Publisher always does).
//   - Order: with one worker, messages are handled in the stream's order,
//     but a naked message comes back after its delay, behind later ones;
//     with several workers, in no order.
//   - A double ack or a nak that the connection loses: the server
//     redelivers after AckWait, and the inbox settles the redelivery.
//   - Messages buffered by the client (Config.Prefetch) when Run stops are
//     left unacked and redelivered after AckWait.
//   - The Duplicates window is a window: a republish after it reaches the
//     consumer, and only its inbox (whose records must outlive the
//     broker's redeliveries) drops it.
package natsjs
