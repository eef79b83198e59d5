// Package outbox publishes events atomically with the business write that
// causes them: the transactional outbox.
//
// The business code adds a Message (topic, key, payload, headers) to the
// outbox table in its own transaction — sqlstore's OutboxStore.Add, on
// PostgreSQL, MySQL/MariaDB or SQLite — so the event exists if and only if
// the change it reports committed. A Relay then claims pending messages
// from the Store, hands them to a Publisher (a broker adapter) and marks
// sent those the broker confirmed. Sent messages are swept after a
// retention.
//
// A message's ID is made when it is added — the store's prefix
// (sqlstore's OutboxConfig.IDPrefix), then NewID's 26 characters: the
// time in milliseconds and 80 random bits, a ULID — and stored with it
// (sqlstore's idem_outbox.msg_id). The publisher sends it as the
// broker's message id (NATS Nats-Msg-Id, AMQP message_id), so that a
// message published twice — a relay that died after the broker's
// confirmation and before its mark — is dropped by the broker's
// de-duplication window or by the consumer's inbox. Both de-duplicate
// across every producer they hear from, so an ID must never name two
// messages: not the row's id, which a second database, a database
// dropped and re-created or one restored from a backup gives again to
// other messages; not anything the relay computes at a claim, which a
// change of configuration between two publishes of one message (a
// rolling deploy) would change. Rows added before sqlstore stored the
// ID keep the one they were published with: the prefix and the row's id.
//
// A message's headers are the application's: Add refuses (see
// Message.Validate) the names a broker or a publisher interprets — any
// Nats- header (the publisher's Nats-Msg-Id, JetStream's
// Nats-Expected-*, Nats-Rollup, Nats-TTL), RabbitMQ's CC and BCC
// (routing) and x-death, x-*-death-*, x-delivery-count, and the adapters'
// Idem-Key and amqp-redelivered — so that a header never changes what
// the broker does with the message or overrides its ID. A pending row
// that an older build added with such a header is published without it
// (the relay logs the message's ID and the names it dropped): published
// with it, the broker would act on it, or refuse it on every attempt and
// hold its key back forever.
//
// Stores: MemoryStore (this package, one process) and the sqlstore
// package's OutboxStore. The outboxtest package is the conformance suite
// every store passes.
//
// # What it guarantees
//
//   - A message is added in the caller's transaction: a rolled-back
//     transaction leaves no message; a committed one leaves it pending
//     until a relay publishes it.
//   - Every pending message is published at least once, with the ID it
//     got at Add, again and again until the publisher confirms it.
//   - No two messages share an ID, across stores, databases and the life
//     of one (re-created, restored from a backup), with the odds of 80
//     random bits for IDs made in one millisecond: with the default
//     settings, outboxes that publish into one stream need no prefix of
//     their own for the broker or the inboxes to keep all their messages.
//   - Messages of one non-empty key are published in the order they were
//     added (the order of the rows' ids, which is the commit order of
//     transactions that serialise on the business row they change), each
//     only after the one before was confirmed and marked: a claim takes
//     only the oldest pending message of each key. This holds with any
//     number of relays, in one process or many: on PostgreSQL and MySQL
//     8/MariaDB 10.6 a batch holds its rows with FOR UPDATE SKIP LOCKED
//     until it marks them; on SQLite a fenced lease lets one relay at a
//     time claim, and a relay whose lease ended cannot mark.
//   - A message is marked sent only after the publisher confirmed it.
//   - A slow broker slows the relay down but does not stop it: a batch
//     with a lease (a Deadliner, as sqlstore's) is published only while
//     a fifth of its lease is left to mark what was confirmed; the rest
//     waits for the next claim.
//   - A relay wakes on new messages without polling often: on PostgreSQL
//     a trigger's NOTIFY wakes it when a transaction that added messages
//     commits; elsewhere it polls every RelayConfig.PollInterval (1 s).
//   - Timestamps (CreatedAt, the sending time that Sweep compares) come
//     from the store's clock: the database's.
//
// # What it does not guarantee
//
//   - Exactly-once delivery: a relay that dies (or loses its SQLite lease)
//     between the broker's confirmation and the mark leaves the message
//     pending, and it is published again with the same ID. Consumers
//     de-duplicate by ID (package inbox), or the broker does within its
//     window.
//   - Order between keys, or among messages with an empty key.
//   - Order between messages of one key added by transactions that
//     overlap without serialising on anything: their ids were taken in
//     one order and may commit in the other.
//   - Throughput on one key: a claim takes one message per key, so a key
//     moves one message per claim (a few milliseconds); many keys move in
//     parallel, up to RelayConfig.BatchSize per claim.
//   - IDs that a consumer can order or count by: an ID's time part is
//     the adding process's clock, and IDs made in one millisecond are in
//     no particular order.
//   - Uniqueness of the IDs of rows added by a build before the stored
//     ID (the prefix and the row's id) across databases, or across a
//     change of the prefix while they are pending; nor one ID for a
//     message that a relay of such a build, still running in a rolling
//     upgrade, publishes too (it publishes every row as the prefix and
//     the row's id).
//   - A message refused by the publisher forever (a poison message) holds
//     its key back forever; the relay logs each failure.
package outbox
