// Package shop is idem's reference service: a small shop whose effects must
// happen once however often a client retries.
//
// Version 1 serves orders:
//
//	POST /orders              create an order (Idempotency-Key required)
//	GET  /orders/{order_no}   one of the caller's orders
//	GET  /orders              the caller's orders, newest first
//	GET  /healthz             liveness and database reachability
//	GET  /products            the catalogue, with the stock left
//	POST /orders/{order_no}/cancel   cancel a waiting order (WAIT_PAY → CANCELLED)
//	POST /orders/{order_no}/refunds  refund a paid order (Idempotency-Key required)
//	POST /orders/{order_no}/card-checkout  pay a waiting order by card and ship it:
//	                                 {"source", "address"} (Idempotency-Key required)
//	POST /coupons/{id}/claim  claim a coupon, once per user
//	GET  /users/me/coupons    the caller's coupon claims
//	GET  /users/me/points     the caller's loyalty points: {"balance", "ledger":[{"order_no","event","points","at"}]}
//	POST /tokens              a submit token for the caller (Submit-Token of POST /orders)
//	POST /payments/callback   a payment provider reports a payment (signed; see Payments)
//
// and pages, for browsers:
//
//	GET  /                    the checkout page (/?uid=N signs in as user N)
//	POST /checkout            the checkout form: 303 to the order's page
//	GET  /orders/{order_no}   the order's page (for a request without X-User-ID that accepts text/html)
//	POST /orders/{order_no}/pay      the simulated payment (a form post of the order page)
//	POST /orders/{order_no}/cancel   cancel (a form post without X-User-ID gets 303 to the page)
//
// # Submit tokens and pages
//
// A submit token (POST /tokens, or the hidden field of the checkout form)
// is spent in the transaction that creates the order and records the
// order's number and the fingerprint of the order request (sku, quantity,
// coupon): a second submission of the same order with it creates nothing
// and is led to that order (303 on pages, 409 DUPLICATE_SUBMISSION naming
// it over the API) for a day after the first use, however long the form
// was open; a different order under a spent token creates nothing and is
// refused (an error page, or 422 TOKEN_REUSED); a refused submission
// rolls back with the token unspent. On
// POST /orders the Idempotency-Key comes first: a retry with the same key
// replays its answer whatever its token. The token does not guard what a
// client sends without one. Tokens are package token's, kept in the
// shop's database (sqlstore's TokenStore, table idem_tokens; an unused
// token lives 30 minutes from issue, a used one 24 hours from its use; a
// user keeps at most 20 unused tokens, the oldest going as new ones are
// issued), so every shopd on the database honours every token and a
// concurrent submission waits for the order's transaction; the close
// job's passes sweep the expired ones.
//
// Pages identify the user by the uid cookie (SameSite=Lax, HttpOnly;
// user 1 when a GET has none — GET / then answers 303 to itself with the
// cookie, and issues no token until the cookie comes back), the API by
// X-User-ID; a request carrying
// X-User-ID is always the API's. Form posts need the cookie and pass
// net/http's CrossOriginProtection. Neither identity is authentication.
//
// # Stock, coupons and an order's life
//
// An order reserves its quantity with one conditional update (stock never
// goes below 0) and may use a claim of a coupon (UNUSED → USED) in its
// transaction; its amount_cents is price × quantity minus the coupon's
// discount. Every change of an order's status is a transition of one
// state machine (orderfsm.go): WAIT_PAY → PAID (payment), WAIT_PAY →
// CHARGING → PAID (a card checkout; CHARGING → WAIT_PAY when the card is
// declined), WAIT_PAY →
// CANCELLED (the owner), WAIT_PAY → CLOSED (the close job, after
// -pay-timeout, default 30m), PAID → REFUNDING → REFUNDED (a refund,
// through the payment provider), REFUNDING → PAID (the provider refused
// it). Its Mermaid diagram (a
// test keeps it, and the README's, equal to the machine's):
//
//	stateDiagram-v2
//	    [*] --> WAIT_PAY
//	    WAIT_PAY --> PAID: pay
//	    WAIT_PAY --> CHARGING: charge
//	    CHARGING --> PAID: charged
//	    CHARGING --> WAIT_PAY: declined
//	    WAIT_PAY --> CANCELLED: cancel
//	    WAIT_PAY --> CLOSED: close
//	    PAID --> REFUNDING: refund
//	    REFUNDING --> REFUNDED: refunded
//	    REFUNDING --> PAID: refused
//	    CANCELLED --> [*]
//	    CLOSED --> [*]
//	    REFUNDED --> [*]
//
// A transition is one
// conditional update with the order's version; cancelling and closing give
// the stock and the claim back in the transaction of the transition, only
// when it moved the order, so a repeated cancel, two close jobs, or a job
// racing a cancel or a payment give back once and never close a paid
// order. Cancel and claim need no Idempotency-Key: repeating them is
// harmless (the same order, the same claim). A claim is unique on (user,
// coupon) and takes one of the coupon's total in its transaction; a refund
// is unique on its order.
//
// # Refunds
//
// A refund goes through the payment provider (-provider; package payprov
// simulates one), as an operation of steps (package steps) under the
// request's idempotency record, each step checkpointed in the shop's
// database (sqlstore.StepJournal):
//
//	refunding  PAID → REFUNDING and the refund row (REFUNDING), one transaction
//	provider   POST /v1/refunds at the provider, under a key derived from the
//	           request's (the payment: the order's trade_no; its amount)
//	refunded   the row REFUNDED with the provider's refund id, REFUNDING →
//	           REFUNDED and the event order.refunded, one transaction
//	refused    instead, on the provider's definite refusal: the row deleted,
//	           REFUNDING → PAID, one transaction
//
// The answer is stored in the record with the operation's end: 201 and the
// refund; 200 and the existing refund for an order refunded already
// (another key); 409 REFUND_REFUSED when the provider refused (the order is
// PAID again and a new key may ask again); 404 NOT_FOUND (no such
// order), 409 ORDER_NOT_REFUNDABLE (not paid). When the provider fails or
// does not answer within -provider-timeout (10 s), the answer is 503
// PROVIDER_UNAVAILABLE with Retry-After, the key is released and the order
// stays REFUNDING: the client's retry with the same key resumes at the
// first step not done, and the provider, which de-duplicates by the key,
// refunds once. A request with another key meanwhile gets 409
// REFUND_IN_PROGRESS (not stored). The completer (steps.Runner.Start, in
// every shopd, every -complete-interval, 5 s) finishes the refunds whose
// client stopped retrying, or whose shopd died between two steps, and
// stores the same answer a client would have got. Without -provider (and
// $SHOPD_PROVIDER), shopd embeds a simulated provider on a free loopback
// port, logs its URL, and keeps its state next to the SQLite file
// (payprov.json), so that a refund resumed after a restart meets the
// provider that made it; with a server database, in memory only.
//
// The close job runs in every shopd: a pass every tenth of -pay-timeout
// (from 1 s to 1 min) closes the expired orders, 100 a batch,
// and deletes expired submit tokens, and the sent events and finished
// consume records older than -event-retention (see Events and loyalty
// points), 1,000 rows a statement. Each part loops until nothing is left
// or the pass's budget (20 s, CloserConfig.Budget) is spent, then the
// next pass goes on; each part runs at least one batch a pass, so a burst
// of expired orders does not stop the sweeps. An order expires
// when it has waited -pay-timeout on the database's clock (its created_ms
// is the database's time too), never a shopd process's: an instance whose
// clock is off closes no order early or late. A pass works only in the
// instance holding the lock "shop.close-unpaid" (package lock over
// sqlstore's LockBackend, in the shop's database), taken for the pass and
// released after it, and works under the lease's context, so it stops
// when the lease is lost. The lock's fence is checked by the rows it
// protects: each close transaction first raises shop_jobs.last_fence to
// its fence, only if no higher fence is there (0 rows: ErrFenced, the
// transaction rolls back and the pass ends), so an instance paused past
// its lease cannot close anything after another instance took the lock
// and wrote. A crashed holder's lease runs out after 30 s.
//
// The caller is identified by the X-User-ID header (a positive integer; a
// stand-in for real authentication) and that identity is the idempotency
// scope, so equal keys from different users never meet.
//
// An order row and the idempotency completion commit in one database
// transaction (idem's CompleteTx): either the order exists and every retry
// replays its 201, or neither happened and a retry creates it.
//
// The body of POST /orders is {"sku": string, "quantity": integer}, each
// member spelled exactly so and given once: a case variant ("SKU"), a
// repeated member or an unknown one is refused with 400, because Go's
// encoding/json would read such a body as an order other than the one it
// seems to ask for.
//
// # Errors
//
// Every refusal is RFC 9457 application/problem+json with a stable "code"
// and a "type" that is the address of the code's documentation:
// PROBLEMS.md in this directory lists every code shopd answers with (its
// own and idemhttp's). Requests that Go's HTTP server refuses before any
// handler runs (a malformed request line, a control byte in a header
// value, headers over 1 MiB) get net/http's plain-text 400, 431, 501 or 505
// instead, and a path not in clean form (//orders) is redirected to its
// clean form (307); PROBLEMS.md lists these.
//
// # Payments
//
// A payment provider reports a payment with POST /payments/callback and
// the body {"order_no", "trade_no", "amount_cents", "status": "SUCCESS"}. It
// sends no Idempotency-Key and no X-User-ID; it signs the request instead,
// in the header
//
//	Pay-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
//
// (SignPayment writes it). The secret is shopd's -pay-secret, else
// $SHOPD_PAY_SECRET, else DevPaySecret, which shopd warns about at startup.
// The signature is checked before anything is read from or written to the
// database, the idempotency record included: the body (at most 16 KiB, 413
// beyond) must be signed with the secret, in constant time, under a
// timestamp within 5 minutes of the shop's clock either way. Several v1
// values may be given (a provider rotating its secret signs with both) and
// one that matches is enough; parts other than t and v1 are ignored. A
// missing, repeated, malformed, expired, future or wrong signature is 401
// BAD_SIGNATURE and nothing is recorded.
//
// A signed SUCCESS callback is applied in one transaction: a payment row,
// unique on trade_no, and the order's transition WAIT_PAY → PAID at the
// version read (version + 1; updated_ms is the payment's created_ms), and
// the answer 200 {"result":"SUCCESS"}. Repeats are harmless at two levels.
// The idempotency middleware, keyed by the trade and what the callback says
// about it (trade_no, status, order_no, amount), scoped to the provider,
// replays the first answer; a repeat that arrives while the first runs
// waits for its answer (up to 5 s) instead of getting 409. Under it, and
// on their own once the record has expired, the business guards hold: a
// trade_no already recorded for the same order and amount is success with
// no second row and no second transition.
//
// A signed callback that must not be applied is recorded once per trade_no
// in shop_reconciliations (later repeats keep the first reason) and is
// answered:
//
//	409 AMOUNT_MISMATCH    the amount is not the order's (the order stays as it was)
//	409 ORDER_NOT_PAYABLE  the order is cancelled, closed or refunded (reason ORDER_NOT_PAYABLE),
//	                       or paid already by another trade (reason DUPLICATE_PAYMENT: refund it)
//	409 TRADE_CONFLICT     the trade_no paid another order or amount already
//	404 ORDER_NOT_FOUND    no order has this number
//
// Providers repeat callbacks answered otherwise than 2xx; each repeat gets
// the same answer and adds no row. A status other than SUCCESS (FAILED,
// say) changes nothing: the order stays WAIT_PAY, payable by another trade
// until it is cancelled or closed, and the callback is acknowledged with 200
// {"result":"SUCCESS"} so that the provider stops sending it. A body that is
// not such an object (exact member names, each once, amount_cents an
// integer of 0 or more) is 400 INVALID_REQUEST.
//
// The order page's "Pay (simulated)" makes the shop send itself a signed
// callback for the order's amount three times at once, as providers do,
// through its own handler; its trade number is derived from the order, so
// paying twice repeats one trade instead of paying twice.
//
// # Card checkouts
//
// POST /orders/{order_no}/card-checkout {"source": "tok_visa", "address":
// "…"} pays a waiting order with a card at the payment provider and books
// its shipment with the carrier (payprov's /v1/charges and
// /v1/shipments): two foreign calls in one operation of steps, named
// card-checkout. WAIT_PAY → CHARGING first (the close job and a cancel
// leave a CHARGING order alone); the charge; CHARGING → PAID with the
// payment row (trade_no: the charge's id, so a refund refunds the charge)
// and order.paid; the shipment; the shipment row (shop_shipments). It
// answers 201 {"order_no", "status", "amount_cents", "charge_id",
// "shipment_id", "tracking_number"}; 402 CARD_DECLINED when the card was
// declined (the order is WAIT_PAY again); 409 SHIPMENT_REFUSED when the
// carrier refused (the order stays PAID); 409 ORDER_NOT_PAYABLE for an
// order not waiting for its payment; 503 PROVIDER_UNAVAILABLE as refunds
// do. A retry after the charge resumes at the shipment: the card is
// charged once.
//
// # Running
//
// Main runs shopd: the first SIGINT or SIGTERM stops accepting requests
// and lets those in flight finish (up to 30 s; requests still running then
// are abandoned, status 1); a second one exits at once with status 1 (one
// within 250 ms of the first is that stop delivered twice, as timeout(1)
// does, and is ignored). A signal while shopd is still starting (waiting
// for its database, migrating) stops it with status 0. shopd ignores
// SIGPIPE, so a log reader that went away does not end it mid-drain.
// Connections are bounded in time by -read-timeout (a request's headers
// and body, 30 s), -write-timeout (from a request's headers to the end of
// its answer, 1 m; it must exceed -read-timeout plus -wait, and when it is
// not given it grows to -read-timeout + -wait + 30 s if that is longer)
// and -idle-timeout (a keep-alive connection between requests, 1 m). Flags
// are checked and -addr is bound before any data is touched. -lease (30 s)
// is how long a request holds its Idempotency-Key, renewed while it runs:
// a request whose shopd died is taken over by a retry once it ends. The
// environment variable SHOPD_CRASH_AFTER_STEP (a step of a refund:
// refunding, provider-call, provider, refunded, refused; or of a card
// checkout: charging, charge-call, charge, declined, paid, ship-call,
// ship, shipped) makes shopd kill itself with SIGKILL when that step ends,
// for crash tests (Config.AfterStep).
//
// # Events and loyalty points
//
// Paying, cancelling, closing and refunding an order write order.paid,
// order.cancelled, order.closed and order.refunded to the outbox
// (sqlstore's OutboxStore, table idem_outbox) in the transaction of the
// transition, and only when the transition moved the order: thirty
// repeats of a payment callback write one order.paid, and a transition
// that rolls back writes none. The payload is OrderEvent's JSON
// (order_no, user_id, amount_cents, event, at); the row's topic is the
// event's name (order.paid), the key the order number (one order's events
// are published in order), the message ID -event-prefix (default "shop-")
// and 26 characters of time and randomness (outbox.NewID), made when the
// event is written and kept in its row (events written by an older
// shopd keep the ID it gave them, the prefix and the row's id): two
// shops' events never share an ID, even on one stream, nor does a
// database re-created or restored from a backup give an ID again.
//
// shopd runs the outbox relay, which publishes them to the broker on
// "NAME.<event>" (shop.order.paid; NAME is -events, see below), and the
// loyalty consumer, which reads them back and, with inbox.HandleTx on the
// shop's database (group shop-loyalty), writes a row of shop_points per
// event in the transaction of its consume record: PointsFor(amount)
// points (10 per whole currency unit: 1299 cents → 120) for order.paid,
// as many taken back for order.refunded; other events change nothing. A
// redelivery is a duplicate, and (order_no, event) is unique in the
// ledger. An event is checked against the order it names, read and locked
// in that transaction: one for an order the shop does not have, for
// another user or amount, or for an order not in the state the event
// leads to (a payload from another producer on the shop's subjects) grants
// nothing and is retried, then dead-lettered. An order.refunded handled
// before its order.paid (a failed order.paid redelivered later) takes
// back nothing, and the order.paid after it grants nothing: a balance
// never goes below zero. The balance is the sum of the user's rows. Both stop, after the
// HTTP server drained, before the database closes.
//
// -broker chooses the broker: nats://host:port (NATS JetStream) or
// amqp://user:pass@host:port/vhost (RabbitMQ). -events NAME (default
// "shop"; 1 to 32 of a-z, 0-9 and '-', starting with a letter) names
// everything shopd declares there, and shopd declares it at start-up:
//
//	NATS JetStream  the stream NAME_ORDERS (NAME in capitals, '-' as '_') on NAME.order.>,
//	                its durable consumer NAME-loyalty, dead letters in NAME_ORDERS_DEAD
//	RabbitMQ        the topic exchange NAME.events, the queue NAME-loyalty bound to
//	                NAME.order.*, dead letters in the queue NAME-loyalty.dead
//
// so the default is SHOP_ORDERS, shop.order.>, shop.events and
// shop-loyalty, the names of shopd before the flag. Two shops (two
// databases) on one broker must set different -events: on the same names
// their consumers would take each other's events and grant the points in
// the wrong database. The instances of one shop (one database) share
// -events, so they share the stream or the queue, and each event's points
// are granted once. They need not change -event-prefix: no two events
// share an ID, and each namespace has its own stream and queue, and
// each shop its own inbox. A shop whose database is dropped and
// re-created, or restored from a backup, keeps its -events: the events
// it writes then have new IDs, which the stream does not take for
// duplicates of those it published before.
//
// The outbox row holds the event's name, not the topic: the relay adds
// NAME when it publishes, so the rows pending when -events changes are
// published under the new name (rows of a shopd from before this rule
// hold shop.order.paid and are published as NAME.order.paid too). A
// rename moves the shop to a new stream or queue, and what was published
// under the old name and not yet consumed stays there: rename every
// instance at once, after the loyalty consumer caught up (the old
// durable or queue empty). -event-prefix may change at any time: an
// event's ID is fixed when the event is written, so an event published
// again after the change keeps the ID that the stream and the consume
// records de-duplicate; new events get the new prefix. (Not while
// events of an older shopd, whose ID is the prefix and the row's id, are
// still pending: let the relay catch up after the upgrade first.)
//
// Without -broker shopd starts a NATS server with JetStream in its
// own process, on a free loopback port, storing under -nats-store
// (default: nats next to the SQLite file, <-data>/nats; ./shopdata/nats
// with a server -db): the default is the production path with nothing to
// install. Two NATS servers never share a store: shopd locks it, and when
// another shopd on the host holds the default one it takes nats.2,
// nats.3, … (a -nats-store in use is an error). Each instance then has a
// broker of its own; the outbox and the inbox are the database's, so every
// event is still published and its points granted once. shopd prints
// which broker it uses and the names.
//
// The points appear after the relay and the consumer ran: a moment after
// the payment, not in its answer.
//
// The close job's passes (see above) sweep what is done with: sent events
// (idem_outbox rows whose sent_at is older) and finished consume records
// (idem_inbox rows succeeded or dead, updated_at older) after
// -event-retention, by default 7 days, at least 1 hour. A consume record
// must outlive every redelivery of its message, or the redelivery is
// handled again: 7 days is far longer than the broker redelivers a
// message that is being handled (the durable's AckWait, 30 s; RabbitMQ
// at once when a consumer's connection drops) and than NATS's 2-minute
// de-duplication window, and covers a loyalty consumer that is down for
// up to a week with a message handled and not acked. Keep it longer than any
// outage you may have to recover from. A sent event is never published
// again; it is kept for inspection. The relay itself sweeps nothing.
//
// Tested by killing shopd processes with SIGKILL (the embedded NATS
// server, the machine's NATS and RabbitMQ): between the broker's confirm
// and the relay's mark, the row stays pending and the next shopd
// publishes it again; between the loyalty consumer's commit and its ack,
// the broker redelivers and the consumer acks a duplicate; either way the
// points are granted once.
//
// # Databases
//
// The orders live in the database of the idempotency records, so that
// CompleteTx works on every backend: SQLite (the default, one file;
// several processes on one host), PostgreSQL or MySQL/MariaDB (any number
// of processes). shopd's -db flag chooses it:
//
//	sqlite:PATH                           default sqlite:<-data>/shop.db
//	postgres://user:pass@host:port/db     or postgresql://…, read by pgx
//	mysql://user:pass@host:port/db?k=v    translated into a go-sql-driver DSN; port 3306 by default, k=v are the driver's DSN parameters
//	mysql:user:pass@tcp(host:port)/db     a raw go-sql-driver DSN (unix sockets, say)
//
// Every server URL or DSN must name its host (for PostgreSQL: in the
// authority, or as ?host=/socket/dir) and its database: shopd refuses to
// fall back on the drivers' defaults (a local server, a database named after
// the OS user) and migrate a database nobody named.
//
// -data DIR is short for -db sqlite:DIR/shop.db; giving both is an error.
// A server database gets a pool of at most 16 connections; SQLite keeps
// sqlite.Open's single connection. -redis redis://host:port/db
// (go-redis ParseURL syntax; rediss:// for TLS) puts Redis in front of the
// database (tieredstore): Redis answers replays and in-flight duplicates,
// the database decides, and a Redis outage only slows requests down.
//
// Each dialect has its own migrations (migrations/sqlite, migrations/postgres,
// migrations/mysql) and Migrate is safe when several processes start at once
// on one database: one SQLite write transaction; one PostgreSQL transaction
// under pg_advisory_xact_lock; on MySQL, which commits DDL statement by
// statement, GET_LOCK('idem_shop_migrate') and statements safe to rerun.
// Statements are written with ? and rebound to $n for PostgreSQL.
//
// Every transaction the shop runs (an order, a checkout, a claim, a
// cancel, a refund, a payment, an operator's retry of an event) runs
// under one retry policy: when the database refuses it as a deadlock
// victim or could not serialise it (sqlstore.Retryable), or uniq could
// not read back the duplicate its insert met because the transaction's
// snapshot predates the other row (uniq.ErrNotVisible), the whole
// transaction runs again, its CompleteTx included, up to 30 attempts, after a pause with
// exponential backoff and full jitter (from 1 ms, at most 100 ms),
// until the request's context ends. So the shop also runs on a database
// whose default isolation is REPEATABLE READ or SERIALIZABLE
// (PostgreSQL's default_transaction_isolation, MariaDB's tx_isolation),
// where every waiter on a hot row (a product's stock, a coupon, a
// token) but the first fails each round: a burst of a few hundred
// requests on one row goes through. A lock wait timeout (MySQL 1205) is
// not retried: it already waited innodb_lock_wait_timeout. idem's own
// statements (an acquire, a renewal, a completion outside the order's
// transaction) run at READ COMMITTED whatever the default (sqlstore does
// so on PostgreSQL), so requests on different keys never fail each
// other there. The concurrency tests run on SQLite, on PostgreSQL at READ
// COMMITTED, REPEATABLE READ and SERIALIZABLE, and on MariaDB at
// REPEATABLE READ, READ COMMITTED and SERIALIZABLE, each set on the
// session.
package shop
