// Package idemotel turns what idem's packages report to an idem.Observer
// into OpenTelemetry spans, and carries a trace through the outbox into
// the consumer that handles the message.
//
// New returns the Observer: give it to idemhttp's, idemgrpc's, the
// Guard's, the inbox's, the outbox relay's, the lock's and the tokens'
// Config (idem.Observers combines it with a metrics Observer). Each
// operation that lasts (a request's decision, a store call, a message's
// handling, a relay's batch, a lock attempt, a token's consume) is a span
// named after it ("idem.request", "idem.store.acquire",
// "idem.inbox.handle", "idem.outbox.publish", "idem.lock.acquire",
// "idem.token.consume"), a child of the span in the operation's context,
// with the attributes idem.kind, idem.op, idem.route, idem.store,
// idem.outcome and idem.key_hash (idem.HashKey's: the key itself is never
// recorded; nor is a scope, a message ID or a lock's name), idem.n and
// idem.age_ms where the event carries them, and an error status with the
// error recorded when the operation failed. An instant (a lease lost, a
// backlog measured) is an event of the span in its context, if one is
// recording; without one it is dropped.
//
// # Across the broker
//
// A producer that adds a message to the outbox in a traced request puts
// the request's trace context in the message's headers with Inject
// (W3C traceparent and tracestate, or the global propagator's fields):
//
//	msg.Headers = idemotel.Inject(ctx, msg.Headers)
//	id, err := outboxStore.Add(ctx, tx, msg)
//
// The relay publishes the headers with the message, the broker adapters
// (natsjs, rabbitmq) hand them to the inbox in inbox.Message.Headers,
// and the inbox reports them on Start. The consumer's "idem.inbox.handle"
// span is then a child of the producer's span, in the producer's trace,
// when the consumer's context has no span of its own (the adapters'
// contexts have none); when it has one (a receive span the application
// started), the handle span stays its child and links to the producer's
// span instead. The handler's spans are children of the handle span.
//
// Inject is explicit rather than a hook of the outbox's Add: Add runs in
// the caller's transaction with the caller's context, so the caller
// decides which trace a message belongs to (a message added for a
// background job may belong to none).
package idemotel
