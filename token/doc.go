// Package token issues pre-issued submit tokens and spends each at most
// once: the guard of a form, a checkout page or any submission that must
// not take effect twice.
//
// Issue makes a token for a scope (the user, the account) and stores it;
// the page hands its ID to the client. Consume, when the client submits,
// spends the token atomically with a Use: the submission in a canonical
// form (Request, of which the store keeps only the SHA-256) and a result
// (in a shop: the order the submission created). A second Consume of the
// same token with the same request answers a *UsedError carrying that
// result, so a repeated submission (a double click, a reload, a client's
// retry) can be led to what the first one made instead of making it
// again; with a different request it answers a *MismatchError
// (ErrMismatch, not ErrUsed): that is another submission, not to be led
// to the first one's result. An unknown, expired, trimmed, malformed or
// another scope's token answers ErrInvalid, distinct from ErrUsed.
//
// Stores: MemoryStore (this package, one process), the sqlstore package's
// TokenStore (PostgreSQL, MySQL/MariaDB, SQLite; with ConsumeTx, which
// spends the token in the caller's transaction) and the redisstore
// package's TokenStore. The tokentest package is the conformance suite
// every store passes.
//
// # What it guarantees
//
//   - IDs are 128 bits from crypto/rand (Config.Rand), written as 22
//     characters of unpadded base64url: URL-safe, unguessable.
//   - A token is bound to its scope: Consume under another scope answers
//     ErrInvalid, does not spend it, and does not reveal that it was used.
//   - Consume is atomic in the store (one Lua script on Redis, one UPDATE
//     on SQL): of any number of concurrent Consume calls on one token, in
//     one or many processes, exactly one answers nil; the others answer a
//     *UsedError with that call's result.
//   - An unused token lives Config.TTL (30 min by default) from Issue. A
//     used token is remembered, with its result, its request's
//     fingerprint and the time of its use, at least Config.Keep (24 h by
//     default) after its use: the use moves its expiry to the later of
//     the two. After that it answers ErrInvalid.
//   - A spent token presented with a different Request (both uses with
//     one) answers *MismatchError, never nil or *UsedError; a Use without
//     Request is not checked, either way.
//   - A scope holds at most Config.MaxLive (20 by default) unused tokens:
//     each Issue removes the older ones beyond it (Store.Trim); used
//     tokens are neither counted nor removed. A failed trim does not fail
//     the Issue (the Observer hears of it); the next one trims again.
//   - Expiry is decided by the store's clock (the database's, Redis's),
//     never by the application server's.
//   - Stores keep the SHA-256 of the ID (Digest), never the ID: someone
//     who can read the table or the keys cannot present a token found
//     there.
//   - A malformed ID (wrong length or alphabet, a non-canonical spelling),
//     an invalid scope (ErrScope: empty, longer than 255 bytes, not UTF-8,
//     control characters) and a result longer than MaxResultLen (16 KiB)
//     are refused before any call to the store.
//   - Stores keep the SHA-256 of the Request, never the Request.
//   - With sqlstore, ConsumeTx spends the token in the transaction that
//     writes the effect: both commit, or neither does. A concurrent
//     Consume waits for that transaction and then answers ErrUsed with its
//     result, or spends the token if it rolled back.
//
// # What it does not guarantee
//
//   - A token makes one submission take effect once only if the effect and
//     the spending agree. With Consume first and the effect after, a crash
//     in between leaves the token spent and the effect undone (the client
//     must reload the form); with the effect first, a crash leaves the
//     effect without its token spent. Only ConsumeTx, with the effect in
//     the same SQL database, ties the two.
//   - It does not make a request idempotent by itself: a client that
//     never loaded the form has no token. Pair it with idempotency keys
//     (idemhttp) where clients retry on their own.
//   - An error other than ErrInvalid and ErrUsed (the store unreachable, a
//     timeout) leaves the token's state unknown: it may have been spent.
//     A retry of Consume with the same Use settles it.
//   - The result is a reference (an order ID, a URL), at most 16 KiB, not
//     a response to replay; an empty result reads back as nil.
//   - On Redis, a token lives as long as its key: a server that evicts
//     keys (volatile-* or allkeys-* under maxmemory), loses writes in a
//     failover or restarts without persistence forgets tokens, used ones
//     included; a forgotten used token answers ErrInvalid, never nil.
//   - MemoryStore is one process's memory: nothing is shared between
//     instances or survives a restart.
//   - SQL stores keep expired tokens until Sweep removes them.
package token
