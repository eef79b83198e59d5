// Package admin is the operator page that shopd and idem proxy serve at
// /admin/: live counters of what idem decided, the in-flight and the
// oldest idempotency records, stuck consume records and dead messages,
// dead and waiting operations of package steps, payments held for
// reconciliation, and buttons to evict a record, to retry a dead message
// or to retry an operation. It is served by the program itself: html/template
// pages, with a small stylesheet and script embedded, no build step.
//
// # Access
//
// The page is off unless the program is given a token (Config.Token, at
// least MinTokenLen bytes): without one every path under /admin/ is
// answered 404. With one, a request is the operator's when it carries
// the token as "Authorization: Bearer TOKEN" (for scripts), or the
// cookie of a session opened by the login form, which takes the token:
// an HttpOnly, SameSite=Strict cookie, limited to /admin/, Secure over
// TLS (the connection's, or a terminating proxy's X-Forwarded-Proto or
// Forwarded proto=https), valid for 12 hours (at most 64 sessions are kept; the oldest
// goes first). The token is compared in constant time. A request with
// neither is answered 401 (GET /admin/ with the login form).
//
// Token checks (the login form's and bearer tokens') are limited. A
// client is the IP of the connection's remote address (an IPv6 address
// counts by its /64); X-Forwarded-For and Forwarded are not trusted, so
// behind a proxy every client is the proxy. Its first five failures in a
// row are free; each further one locks it out for 1 s, doubling up to 5
// minutes. And past 30 failures in a minute, of all clients together,
// everyone is locked out until the minute ends, so that an attack spread
// over many addresses is slowed as well (a success does not reset this
// count). A locked-out attempt is refused with 429 and Retry-After
// without its token being looked at: the right token is refused too, so
// that a refusal never tells whether a guess was right. A success
// forgets its client's failures; failures are forgotten an hour after
// a client's last one, and at most 1024 clients are kept (the one whose
// last failure is the oldest goes first). Sessions opened already are
// not affected: a flood of wrong tokens (30 a minute, from anywhere) keeps
// everyone from signing in, bearer-token scripts included, for as long as
// it lasts, but it does not sign anyone out, and an open session still
// reads and acts. Restrict who can reach /admin/ (a private network, a
// proxy's authentication) where that matters. An Authorization header of
// another scheme than Bearer (such a proxy's Basic authentication) is not
// a token check: it is neither counted nor refused, and the session's
// cookie decides. Each failure is logged, a refusal once per lockout.
//
// Every action is a POST, refused with 403 when the browser says it
// comes from another origin (Origin) or, in a session, when it does not
// carry the session's CSRF token (a hidden field of every form of the
// page). Each action asks for confirmation first: the button posts to a
// confirmation page that names the record or the message, and only its
// Confirm button (confirm=yes) acts. Then the page is shown again
// (303), saying what was done.
//
// # Actions
//
//   - Evict deletes a record from the store: a retry with its key runs
//     as a new request. A record being executed (processing, its lease
//     not ended) is refused (409): a retry would run while the execution
//     still runs. The confirmation page carries the record's fence and a
//     hash of its owner, and the confirmed post deletes that record only
//     (idem.ConditionalDeleter's DeleteIf, with the owner and fence it
//     reads again; stores without it fall back to idem.Store.Delete after
//     the same check): a record taken over by a retry, or replaced by a
//     new request, since the operator looked at it is another execution's,
//     and is kept (409, "the record changed since you confirmed"). A key
//     without a record, or whose record cannot be read, gets no
//     confirmation page (404, 502), and a confirmed post whose record
//     cannot be read again deletes nothing (502). A
//     record listed is named by its exact bytes; "Evict by key" takes a
//     scope and a key typed in (for stores that cannot list, such as
//     Redis).
//   - Retry is the program's (Config.Retry; see shopd's for the shop's
//     loyalty consumer): it makes the dead message's consume record
//     handled again on its next delivery and publishes the message again.
//   - Retry operation (Config.Operations, a steps.Journal) makes a dead
//     or waiting operation of package steps due now, a dead one with its
//     attempts counted from 0 again (Journal.Retry): the completer of an
//     instance that defines it resumes it after its last checkpoint. A
//     running or done operation has nothing to retry (409, on the
//     confirmation page and on the confirmed post); a key without an
//     operation is 404. An operation is named by its scope and key, and
//     its hash is its record's, idem.HashKey(scope, key).
//
// Every action, and every failed login, is logged (log/slog) with the
// remote address, how the operator authenticated (bearer or session, and
// a hash of the session's cookie), the action, and the record by
// idem.HashKey(scope, key) (a message by its group and idem.HashKey("",
// id), the idem.key_hash of the inbox's span of its handling): the raw
// key or message ID only when Config.LogKeys is set.
//
// # Counters
//
// Counters is an idem.Observer that counts the operations that ended by
// their bounded labels (kind, route, operation, outcome); the page shows
// them and its script refreshes them from /admin/counters.json every two
// seconds.
//
// # What it does not do
//
// Its login limits are per process and in memory (a restart forgets
// them), and they slow guessing, they do not make a short token safe:
// use a long random one. It keeps sessions in the process's memory (a
// restart signs everyone out; two instances behind one address each
// want their own login). Lists are
// bounded (Config.Limit) and read by the stores' operator reads, which
// scan their tables: the page is for looking at, not for polling.
package admin
