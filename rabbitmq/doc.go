// Package rabbitmq connects package inbox and package outbox to RabbitMQ
// (github.com/rabbitmq/amqp091-go).
//
// A Consumer consumes one queue with manual acks and a prefetch (QoS),
// hands each delivery to a HandleFunc — an inbox's HandleTx or Handle, the
// caller's choice (HandleTx and Handle build one) — and settles the
// delivery by the Outcome:
//
//   - Processed, Duplicate → ack, after the inbox's commit.
//   - A store error (the HandleFunc returned an error) → the delivery is
//     kept and the HandleFunc called again after a growing, bounded
//     backoff (ConsumerConfig.Backoff), so a database outage costs time,
//     never a delivery nor an attempt.
//   - A panic of the HandleFunc → a Retry, never the consumer's end.
//   - Retry, InProgress → nack with requeue after the Outcome's Delay. RabbitMQ has no delayed negative ack, so the
//     delivery stays unacked (holding a prefetch slot, not a worker) for
//     min(Delay, MaxRetryDelay) and is then nacked with requeue; the
//     broker puts it back at its place in the queue.
//   - Dead (after MaxAttempts, or a message without a message_id when the
//     inbox derives none: inbox.ErrNoID) → published to
//     DeadLetterExchange/DeadLetterRoutingKey with HeaderDeadReason (the
//     reason), HeaderDeadAttempts and HeaderDeadQueue, under publisher
//     confirms, and only then acked. Without a dead-letter exchange
//     configured, the delivery is rejected without requeue, for the
//     queue's own x-dead-letter-exchange (which gets the broker's x-death
//     header but not the reason).
//
// The protocol is the inbox's consumer loop (inbox.Consumer); this
// package translates AMQP deliveries to it. RabbitMQ guarantees the
// requeue of a delivery not acked when its channel closes, and publisher
// confirms; it has no ack deadline (InProgress is a no-op) but its
// consumer timeout, and no delivery count on classic queues (MaxDeliver
// uses a quorum queue's x-delivery-count). The loop adds the rest.
//
// The message's ID is its AMQP message_id (a message without one gets
// the ID ConsumerConfig.DeriveFrom derives, or is Dead with
// inbox.ErrNoID); Topic is the routing key; Key
// is HeaderKey. The delivery's redelivered flag (HeaderRedelivered) and,
// on quorum queues, its x-delivery-count (HeaderDeliveryCount) are passed
// in the message's headers and logged; they are never used to decide
// whether a message is a duplicate — the flag is set for a message whose
// earlier delivery was never handled, and is not set for a duplicate the
// producer published twice. Only the inbox's record decides.
//
// The Consumer reconnects (with a doubling delay) whenever the connection
// or the channel drops, or the broker cancels its consumer (the queue was
// deleted; ConsumerConfig.Setup declares it again); the broker requeues
// the deliveries that were not acked, and the inbox answers Duplicate for
// those whose effect had committed.
//
// A Publisher is the outbox.Publisher of a Relay: it publishes on a
// channel in confirm mode with msg.ID as message_id, msg.Headers as
// headers, msg.Key as HeaderKey, persistent delivery mode and (by
// default) the mandatory flag, and returns nil only after the broker's
// ack; a nack, a return (no queue bound) or a dropped channel is an
// error, and the relay publishes the message again later. It reconnects
// on the next Publish after a drop.
//
// # What it guarantees
//
//   - A delivery is acked only after the inbox answered Processed or
//     Duplicate (its record and, with HandleTx, the effect committed), or
//     after its dead-letter copy was confirmed by the broker.
//   - With HandleTx, the effect of a message happens once whatever the
//     broker redelivers: after a consumer crash between commit and ack,
//     a dropped connection, a requeue, or a message published several
//     times with one message_id.
//   - A dead message is not lost: if its dead-letter publish fails (the
//     dead-letter queue is missing, the broker nacks), it is retried
//     with the backoff while the delivery is held; if the session ends
//     meanwhile, the broker requeues it and the inbox answers Dead again
//     next time.
//   - A Publisher's nil means the broker confirmed the message (and, with
//     the mandatory flag, routed it to at least one queue).
//
// # What it does not guarantee
//
//   - Order: with Workers > 1, or after a requeue, messages are handled
//     out of queue order.
//   - A single dead-letter copy: a consumer that dies between the
//     dead-letter confirm and the ack dead-letters the message again on
//     its redelivery (the copies share the message_id).
//   - Delays longer than MaxRetryDelay (10 s by default): an inbox
//     Backoff beyond it is cut to it. The broker's consumer timeout
//     (30 min by default) must exceed MaxRetryDelay plus the longest
//     handler, and the longest store outage or dead-letter failure
//     (the delivery is held, unacked, meanwhile: InProgress is a no-op):
//     past it the broker closes the channel, and the held deliveries
//     are requeued, each costing a delivery.
//   - A message that kills its consumer (a crash inside HandleTx) is never
//     dead by the inbox's count, since the rolled-back attempt is not
//     counted: a quorum queue's x-delivery-limit is the backstop.
//   - Publisher throughput: each Publish waits for its confirm (one round
//     trip a message), as the relay publishes in order anyway.
package rabbitmq
