package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on a Message, checked by Validate (and so by every store's Add).
const (
	// MaxTopicLen is the longest topic, in bytes.
	MaxTopicLen = 255
	// MaxKeyLen is the longest ordering key, in bytes.
	MaxKeyLen = 255
	// MaxHeaderNameLen is the longest header name, in bytes (an AMQP
	// table's field names are at most 255 bytes).
	MaxHeaderNameLen = 255
)

// headerNameForbidden are the printable ASCII characters a header name
// cannot have: the NATS client refuses them (and every byte outside
// printable ASCII) in a header name.
const headerNameForbidden = `"(),/:;<=>?@[\]{}`

var (
	// ErrInvalid is wrapped by the error of a message that Validate
	// refuses (no topic, a topic or key too long, not UTF-8 or with a NUL
	// byte, a header name that a broker cannot carry or that a broker or
	// a publisher interprets, a header value not UTF-8).
	ErrInvalid = errors.New("outbox: invalid message")
	// ErrLeaseLost is returned by Batch.MarkSent when the batch's claim
	// ended before the mark (its lease ran out: sqlstore's
	// OutboxConfig.Lease): nothing was marked, and the batch's messages
	// will be published again, with the same IDs.
	ErrLeaseLost = errors.New("outbox: claim lost before the mark")
	// ErrNoNotify is returned at once by a Notifier that cannot notify on
	// this database (a dialect without LISTEN/NOTIFY): the relay then
	// polls only.
	ErrNoNotify = errors.New("outbox: notifications not available")
	// ErrBatchDone is returned by a Batch's MarkSent or Release after the
	// batch ended.
	ErrBatchDone = errors.New("outbox: batch already ended")
)

// Message is one event in the outbox.
type Message struct {
	// ID identifies the message: the store sets it when it adds the
	// message (the store's ID prefix and NewID's 26 characters of time
	// and randomness) and keeps it with the message, so that every
	// publish of it carries this ID whatever changed in between; Add
	// ignores the field. Publishers send it as the broker's message id
	// (NATS Nats-Msg-Id, AMQP message_id), so that a message published
	// twice is recognised by the broker's de-duplication or by the
	// consumer's inbox. It is unique across stores and databases, and
	// across the life of one: a database re-created or restored from a
	// backup gives its row ids again to other messages, never an ID.
	ID string
	// Topic is where the message goes: a subject, a routing key, an
	// exchange; its meaning is the publisher's. Required.
	Topic string
	// Key orders messages: those of one non-empty key are published in
	// the order they were added, each only after the one before it was
	// confirmed. Messages with an empty key are not ordered.
	Key string
	// Payload is the message's body, stored and published as it is.
	Payload []byte
	// Headers are published with the message. A nil and an empty map are
	// the same.
	Headers map[string]string
	// CreatedAt is when the message was added, on the store's clock (the
	// database's), to the millisecond. Add ignores the field.
	CreatedAt time.Time
}

// Validate reports whether m can be added: a topic of 1 to MaxTopicLen
// bytes, a key of at most MaxKeyLen bytes, both valid UTF-8 without a NUL
// byte (a PostgreSQL text column cannot hold one, and no broker takes it
// in a subject), headers whose values are valid UTF-8 (headers are stored
// as JSON, which would replace the invalid bytes: the message would be
// published other than it was added), a key and header values without a
// line break or a space or tab at either end (NATS carries a header
// value on one line, trimmed: it would arrive otherwise), and header
// names of 1 to
// MaxHeaderNameLen printable ASCII characters other than
// ( ) , / : ; < = > ? @ [ \ ] { } and " (what NATS and AMQP both carry: a
// name that a broker refuses would fail every publish of the message, and
// hold its key back forever). The payload may hold any bytes.
//
// Header names that a broker or a publisher interprets are refused too,
// in any case, with an error that names the header and says why:
//
//   - Nats-Msg-Id, which the NATS publisher sets to the message's ID, and
//     every other name starting with Nats- (Nats-Expected-Stream,
//     Nats-Expected-Last-Msg-Id, Nats-Expected-Last-Sequence,
//     Nats-Expected-Last-Subject-Sequence, Nats-Rollup, Nats-TTL, …):
//     the JetStream server acts on them (refuses the message, rolls up
//     its subject, expires it), and later servers may add more.
//   - CC and BCC: RabbitMQ routes copies of the message to the routing
//     keys they list, and closes the channel when one is a string, as a
//     header of a Message is: every publish would fail.
//   - x-death, x-first-death-*, x-last-death-* and x-delivery-count,
//     which RabbitMQ sets (dead-lettering, quorum queues), and
//     amqp-redelivered, which the rabbitmq consumer sets: a consumer
//     would take the message's value for the broker's.
//   - Idem-Key, in which the publishers carry Key.
//
// Other names are the application's, x- names included; the trace
// context (traceparent, tracestate, baggage) passes. The error wraps
// ErrInvalid.
func (m Message) Validate() error {
	switch {
	case m.Topic == "":
		return fmt.Errorf("%w: empty topic", ErrInvalid)
	case len(m.Topic) > MaxTopicLen:
		return fmt.Errorf("%w: topic of %d bytes (at most %d)", ErrInvalid, len(m.Topic), MaxTopicLen)
	case !utf8.ValidString(m.Topic):
		return fmt.Errorf("%w: topic is not UTF-8", ErrInvalid)
	case len(m.Key) > MaxKeyLen:
		return fmt.Errorf("%w: key of %d bytes (at most %d)", ErrInvalid, len(m.Key), MaxKeyLen)
	case !utf8.ValidString(m.Key):
		return fmt.Errorf("%w: key is not UTF-8", ErrInvalid)
	case strings.IndexByte(m.Topic, 0) >= 0:
		return fmt.Errorf("%w: topic has a NUL byte", ErrInvalid)
	case strings.IndexByte(m.Key, 0) >= 0:
		return fmt.Errorf("%w: key has a NUL byte", ErrInvalid)
	case alteredInHeader(m.Key):
		return fmt.Errorf("%w: key %q has a line break, or a space or tab at an end, which a NATS header (Idem-Key) does not carry", ErrInvalid, m.Key)
	}
	for name, v := range m.Headers {
		switch {
		case name == "":
			return fmt.Errorf("%w: empty header name", ErrInvalid)
		case len(name) > MaxHeaderNameLen:
			return fmt.Errorf("%w: header name of %d bytes (at most %d)", ErrInvalid, len(name), MaxHeaderNameLen)
		case strings.IndexFunc(name, badHeaderNameRune) >= 0:
			return fmt.Errorf("%w: header name %q: only printable ASCII other than %s", ErrInvalid, name, headerNameForbidden)
		case !utf8.ValidString(v):
			return fmt.Errorf("%w: header %q: value is not UTF-8", ErrInvalid, name)
		case alteredInHeader(v):
			return fmt.Errorf("%w: header %q: value has a line break, or a space or tab at an end, which a NATS header does not carry", ErrInvalid, name)
		}
		if why := reservedHeader(name); why != "" {
			return fmt.Errorf("%w: header %q is reserved: %s", ErrInvalid, name, why)
		}
	}
	return nil
}

// reservedHeader says why a header of this name cannot be added (a
// broker or a publisher interprets it), or "" when it can. Names are
// compared without regard to case: brokers differ in it, and a name that
// one takes as its own in some case is no name to rely on.
func reservedHeader(name string) string {
	l := strings.ToLower(name)
	switch {
	case l == "nats-msg-id":
		return "the publisher sends the message's ID as NATS's Nats-Msg-Id (the broker de-duplicates by it)"
	case strings.HasPrefix(l, "nats-"):
		return "the NATS JetStream server interprets Nats- headers (Nats-Expected-*, Nats-Rollup, Nats-TTL, …): " +
			"it would refuse, drop, expire or roll up the message, or purge others"
	case l == "cc" || l == "bcc":
		return "RabbitMQ routes copies of the message by it (sender-selected distribution), " +
			"and closes the channel on a value that is a string: every publish of the message would fail"
	case l == "x-death" || strings.HasPrefix(l, "x-first-death-") || strings.HasPrefix(l, "x-last-death-") || l == "x-delivery-count":
		return "RabbitMQ sets it (dead-lettering history, a quorum queue's delivery count): " +
			"a consumer would take the message's value for the broker's"
	case l == "amqp-redelivered":
		return "the rabbitmq consumer sets it from the delivery's redelivered flag"
	case l == "idem-key":
		return "the publishers carry the message's Key in it"
	}
	return ""
}

// alteredInHeader reports whether v would come out of a NATS header other
// than it went in: NATS writes a value on one line, its line breaks
// replaced by spaces, and trims spaces and tabs around it.
func alteredInHeader(v string) bool {
	return strings.ContainsAny(v, "\r\n") || v != strings.Trim(v, " \t")
}

func badHeaderNameRune(r rune) bool {
	return r <= ' ' || r > '~' || strings.ContainsRune(headerNameForbidden, r)
}

// Publisher sends messages to a broker. The broker adapters implement it.
type Publisher interface {
	// Publish sends msg, with msg.ID as the broker's message id, and
	// returns nil only once the broker confirmed it (a JetStream ack, an
	// AMQP publisher confirm): the relay marks the message sent only
	// then. An error leaves it pending: it is published again later,
	// with the same ID, and the messages after it of the same key wait.
	Publish(ctx context.Context, msg Message) error
}

// PublisherFunc adapts a function to the Publisher interface.
type PublisherFunc func(ctx context.Context, msg Message) error

// Publish calls f(ctx, msg).
func (f PublisherFunc) Publish(ctx context.Context, msg Message) error { return f(ctx, msg) }

// Store is the relay's view of an outbox: it hands out pending messages
// in batches and forgets sent ones. Adding messages is the business
// code's, in its own transaction (sqlstore's OutboxStore.Add); the
// outboxtest package is the conformance suite every Store passes.
type Store interface {
	// Claim returns a batch of at most limit (> 0) pending messages, in
	// the order they were added, that no other live batch holds. Of each
	// non-empty key it returns only the oldest pending message (the
	// key's head), and only if no other batch holds it; messages with an
	// empty key are all eligible. A batch may be empty. The messages stay
	// claimed until the batch ends: by MarkSent, by Release, or when its
	// holder dies (its transaction is rolled back, its lease ends).
	Claim(ctx context.Context, limit int) (Batch, error)

	// Sweep removes up to limit (> 0) messages sent at least retention
	// ago (on the store's clock) and returns how many it removed. Pending
	// messages are never removed.
	Sweep(ctx context.Context, retention time.Duration, limit int) (int, error)
}

// Batch is a claim on some pending messages. Exactly one of MarkSent and
// Release ends it; a call after that returns ErrBatchDone. A batch is
// used by one goroutine.
type Batch interface {
	// Messages returns the batch's messages, in the order they were
	// added.
	Messages() []Message
	// MarkSent marks the messages ids (a subset of the batch's) sent and
	// ends the batch, releasing the others, which stay pending. Mark only
	// what the publisher confirmed.
	MarkSent(ctx context.Context, ids []string) error
	// Release ends the batch without marking anything: its messages stay
	// pending and a later Claim returns them again, with the same IDs.
	Release(ctx context.Context) error
}

// Deadliner is implemented by a Batch whose claim ends at a known time,
// its lease (sqlstore's OutboxStore): the relay publishes the batch's
// messages only while enough of the lease is left to mark them, and
// claims the rest again after the mark. Without it, a broker slow enough
// that publishing a whole batch outlasts the lease would cost every mark
// of every batch (ErrLeaseLost), and the relay would publish the same
// messages forever.
type Deadliner interface {
	// Deadline returns when the batch's claim ends, on the relay's
	// clock; zero if it has none.
	Deadline() time.Time
}

// Notifier is implemented by stores that can wake a relay when messages
// are added, so that it need not poll often (PostgreSQL's LISTEN/NOTIFY).
type Notifier interface {
	// Listen calls wake once it listens, and then after every commit
	// that added messages (several commits may share one call), until
	// ctx ends or the listening fails; it returns ctx's error, the
	// failure, or ErrNoNotify at once if the store cannot notify. wake
	// must not block.
	Listen(ctx context.Context, wake func()) error
}

// BacklogStore is implemented by stores that can tell how far the relays
// are behind (sqlstore's OutboxStore, MemoryStore): a relay with an
// Observer reports it (idem.OpBacklog) every RelayConfig.BacklogInterval.
type BacklogStore interface {
	// Backlog counts the pending messages and finds the oldest, with an
	// indexed query.
	Backlog(ctx context.Context) (Backlog, error)
}

// Backlog is what BacklogStore.Backlog measured.
type Backlog struct {
	// Pending is the number of messages not yet marked sent.
	Pending int64
	// Oldest is the CreatedAt of the oldest pending message; zero when
	// none is pending.
	Oldest time.Time
	// Age is how long the oldest pending message has waited, on the
	// store's clock; zero when none is pending.
	Age time.Duration
}
