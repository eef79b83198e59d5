// Package idemhttp is net/http middleware that makes POST and PATCH
// handlers idempotent with the Idempotency-Key request header, following
// draft-ietf-httpapi-idempotency-key-header-07 and Stripe's practice: the
// first request with a key runs the handler and its response is stored;
// a retry with the same key gets the stored response without running the
// handler again. With store an idem.Store, userID a function that returns
// the authenticated caller's identity and createOrder the handler to guard
// (sqlstore's Example_quickStart has the whole program):
//
//	mw, err := idemhttp.New(&idemhttp.Config{
//		Store: store,
//		Scope: userID, // the authenticated caller
//	})
//	if err != nil {
//		return nil, err
//	}
//	mux := http.NewServeMux()
//	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))
//
// The records live in an idem.Store (memstore, sqlstore, …); each request
// runs under an idem.Execution whose watchdog renews its lease while the
// handler runs. ExecutionFrom(r.Context()) returns it to the handler.
//
// # What the middleware answers
//
//   - A request whose method is not covered (Config.Methods; POST and PATCH
//     by default) passes through untouched.
//   - A covered request without Idempotency-Key: 400 MISSING_KEY, or, with
//     Config.KeyOptional, the handler runs unguarded.
//   - A malformed key (see ParseKey: empty, over 255 bytes, control
//     characters, invalid UTF-8, a bad RFC 8941 quoted string) or more than
//     one Idempotency-Key field: 400 INVALID_KEY.
//   - With Config.Key, the key is taken from the request (its body, or a
//     provider's header) and the Idempotency-Key header is ignored: an
//     empty key is 400 MISSING_KEY (or, with KeyOptional, the handler runs
//     unguarded), an error of Key is 400 INVALID_KEY (its text is logged,
//     not shown), and a key idem.ValidateKey refuses is 400 INVALID_KEY —
//     the key is validated, not hashed, so that a record's key stays the
//     provider's identifier. The body is read (and 413 checked) first;
//     replays, 422 KEY_MISMATCH and 409 PROCESSING are as with the header.
//     Key must verify the provider's signature (an error makes no record):
//     the key is recorded before the handler runs, so a forged request
//     with a genuine trade number would otherwise take the key first.
//   - Config.Scope fails: 401 UNAUTHENTICATED, or the status and code of
//     the *ScopeError it returns; a scope idem.ValidateScope refuses: 400
//     INVALID_SCOPE.
//   - A body over Config.MaxRequestBody (1 MiB): 413 BODY_TOO_LARGE. The
//     body is read (and refused) before any record exists; a body that
//     cannot be read is 400 INVALID_REQUEST. With Config.SpoolBody, a
//     larger body is spooled to a temporary file (see Large bodies) and
//     only a body over Config.MaxStreamedBody (1 GiB) is 413; a spool
//     that cannot be written is 503 SPOOL_UNAVAILABLE with Retry-After: 1.
//   - The first request with a key: the handler runs; its response is
//     stored, then sent.
//   - A retry with the same fingerprint after the first completed: the
//     stored status, replayable headers and body, plus
//     Idempotent-Replayed: true. The handler does not run.
//   - The same key with another fingerprint (the first completed or still
//     running): 422 KEY_MISMATCH.
//   - A retry while the first still runs: 409 PROCESSING with
//     Retry-After: 1; or, with Config.Wait, the retry waits up to Wait for
//     the first to finish and gets its response (or 409 if it has not
//     finished, or runs the handler itself if the first was released). A
//     waiting retry polls the store with Get every 5 to 250 ms (growing,
//     jittered) and holds its goroutine while it waits.
//   - The handler answers a status that Config.Release selects (by default
//     5xx; 401, 403 and 407, which refuse the caller's credentials, not
//     the request; 408, 425 and 429) or panics: the record is released
//     (deleted), so a retry runs the handler again. An answer that tells
//     the client to try again is released whatever Config.Release says
//     (a policy that keeps 5xx included): 429, 503, and any 4xx or 5xx
//     with Retry-After (an upstream's own 409 PROCESSING, say); stored, it
//     would be replayed as "try again later" for the whole retention, and
//     the client would stop retrying. Other statuses, the other 4xx and a
//     2xx with Retry-After (a 202 naming a job to poll) included, are
//     stored and replayed.
//   - The store cannot be reached to acquire the key: 503 STORE_UNAVAILABLE
//     with Retry-After: 1 (fail closed), or, with Config.FailOpen, the
//     handler runs unguarded. Key and scope errors stay 400 either way.
//   - A response body over Config.MaxResponseBody (1 MiB): the client gets
//     all of it; the record keeps the status and headers and marks the body
//     omitted, so a retry never runs the handler again. Its replay has the
//     status, the headers (without Content-Length), an empty body and
//     Idempotent-Body-Omitted: true.
//
// Problems are RFC 9457 application/problem+json with the members type,
// title, status, detail and code; the codes are the Code constants and
// PROBLEMS.md, next to this file, documents each (it is what their type
// URIs point to).
//
// # Keys and scopes
//
// A key names one request of one caller: records are keyed by (scope, key),
// and the scope comes from Config.Scope, which must derive it from
// authenticated identity. Without a Scope function every caller shares one
// key space, and a caller who sends another's key gets the other's
// response: use that only for a single caller or unguessable keys.
//
// # Fingerprint
//
// Each record keeps the fingerprint of the request that created it, and a
// key presented with another fingerprint is refused. FingerprintV1 (the
// default) hashes the method, the path, the query parameters sorted by
// name, and the body; a JSON body (Content-Type application/json or
// +json) in canonical form (CanonicalJSON), so that key order and spacing
// do not matter, numbers as written. Invalid JSON is hashed as raw bytes
// and left to the handler to refuse. Headers (other than Content-Type) and
// the host are not part of it. Config.Fingerprint replaces it per
// middleware; its result is versioned ("v1:…"). A body spooled under
// Config.SpoolBody is hashed as raw bytes whatever its Content-Type (see
// Large bodies).
//
// Two requests that encoding/json can decode differently (into structs,
// maps with string or integer keys, or any) never share a fingerprint. Sorting keys alone would break that: encoding/json matches
// member names to struct fields case-insensitively (with Unicode folding:
// the Kelvin sign is a "k", "ſ" an "s") and keeps the last of two members
// it takes for the same name, so {"quantity":1,"Quantity":1000} and
// {"Quantity":1000,"quantity":1} sort alike yet decode to 1000 and 1. A
// body with such an object (names equal exactly, case-folded, after
// unescaping, anywhere in the body; or equal as integer map keys, "1" and
// "01") is therefore hashed as raw bytes, tagged apart from canonical
// bodies: only the very same bytes match it, and those decode alike. Such
// a body is not refused: whether it is valid is the handler's decision,
// as for invalid JSON, and a retry of it still replays (a retry resends
// the same bytes). Bodies without such objects hash as they always did,
// which is why the algorithm stays v1; a body with one that was stored
// before this rule gets 422 KEY_MISMATCH on a retry within its retention,
// never another request's response. Beyond encoding/json's own rules the
// fingerprint cannot know a handler's decoder: a decoder that reads key
// order or spacing (json.RawMessage, a token stream) sees what the
// fingerprint ignores, and map keys that a TextUnmarshaler reads as equal
// are not detected; such handlers should refuse repeated names themselves
// or set a Fingerprint of their own.
//
// # The first request
//
// The handler gets a copy of the request (the incoming one is never
// changed) whose context is the execution's and whose body is a fresh
// reader over the bytes the middleware read and fingerprinted (in memory,
// or spooled: see Large bodies). Its
// response is held back: the record is completed (or released) first, and
// only then does the client get the answer, so a client that retries after
// getting it always gets a replay. If the completion fails because the
// store is down, it is tried again for up to the guard's
// GuardConfig.CompleteRetry (10 s by default; a store failing over comes
// back within it), the lease renewed meanwhile, before the client gets
// its answer. If it still cannot be stored, the client gets the real
// response; the error is logged and the record is left to its lease,
// after which a retry runs the handler again. If the lease was lost, see
// below.
//
// Replayable response headers are an allow-list: Content-Type,
// Content-Encoding, Content-Language, Content-Disposition, Location, ETag
// and Last-Modified, plus Config.ReplayHeaders, stored under their
// canonical names (ETag as Etag: names are case-insensitive, and
// idem.Response keys are canonical). Set-Cookie, Authorization
// and hop-by-hop headers are never stored, so they reach the first
// response only. One filter applies to every response an execution
// stores, whoever stores it: the middleware, or the handler through
// Execution.Complete or CompleteTx (it is the guard's
// idem.GuardConfig.Prepare). It keeps the allow-listed headers only, and
// replaces a body over MaxResponseBody with the omitted marker. A replay
// sends only the allow-listed headers of a record too, whoever stored it. A Content-Type that net/http would sniff is sniffed by the
// middleware and stored, so first response and replay agree. As in
// net/http, header changes after WriteHeader are not sent; trailers work.
//
// A handler whose effect is in the store's SQL database should complete
// in its own transaction: build the response (JSONResponse), call
// ExecutionFrom(ctx).CompleteTx(ctx, tx, resp), commit, and write it
// (WriteResponse). The effect and the stored response then commit together
// or not at all. After the handler returns, the middleware asks whether
// that completion committed (Execution.Committed); if it did, the client
// gets exactly the committed response — what every replay will serve —
// in place of whatever the handler wrote (its non-replayable headers, such
// as Set-Cookie, stay). If the transaction rolled back, the handler's
// status decides as usual (release or store). A handler may also end the
// execution itself (Execution.Complete or Release); the middleware then
// only sends its response.
//
// When the handler cannot tell whether its effect happened (it forwarded
// the request to another service and the answer never came), neither
// storing its error nor releasing the key is right: a stored error would
// be replayed for an effect that may have happened, and a released key
// would let a retry repeat it. The handler calls
// ExecutionFrom(ctx).Abandon() and writes its answer (a 502, say): the
// client gets that answer, the record stays processing and the watchdog
// stops renewing it, so retries get 409 PROCESSING until the lease ends
// (at most Lease after the last renewal), and a retry after that takes
// the key over and runs the handler again. idem proxy answers an upstream
// timeout so.
//
// A lost lease (the watchdog could not renew it and another request took
// the key over) cancels the handler's context with cause idem.ErrLeaseLost;
// its completion is then refused, so the takeover's response stands.
//
// The client of the execution that lost its lease does not get that
// execution's response: no retry would ever replay it, and it may name an
// effect that was rolled back or that the takeover repeated. When the
// completion (or release) is refused with idem.ErrLeaseLost, or the
// handler ended the execution itself and it was cancelled for a lost
// lease, and nothing of the response has reached the client yet, the
// middleware answers what a retry would get at that moment: it reads the
// record (bounded by StoreTimeout), and replays the takeover's response
// (with Idempotent-Replayed: true) if it completed with the same
// fingerprint, or answers 409 PROCESSING with Retry-After otherwise (the
// takeover still runs; or the record is gone, holds another request, or
// cannot be read, which is also logged at warn level). Headers the
// handler set are dropped; those set before it ran (by middleware around
// this one) stay. A response that has started (Flush, streaming past
// MaxResponseBody, Hijack) cannot be taken back: its client gets it as
// written, and the loss is logged. So once the handler's context says the
// lease was lost, a response that has not started stays held back: Flush
// (http.ResponseController's) and Hijack fail with an error matching
// idem.ErrLeaseLost.
//
// # Large bodies
//
// The fingerprint must be known before the key is acquired (the store
// compares it, and a retry with another body must never run the effect),
// so the middleware reads the whole body before the handler runs. By
// default it holds it in memory, up to MaxRequestBody. A route that takes
// uploads sets Config.SpoolBody: the first MaxRequestBody bytes (and one)
// of a body stay in memory, the rest goes, as it arrives, to a temporary
// file in Config.SpoolDir (os.TempDir() by default) while it is hashed;
// then the key is acquired, and the handler gets a body that reads the
// memory part, then the file: a stream, whose ContentLength is the
// body's size. Memory stays bounded whatever the body's size, on the
// first request and on a replay alike (a 100 MiB upload allocates about
// 1.2 MiB with the default MaxRequestBody). The file is unlinked as soon
// as it is created where the system allows it (Unix; elsewhere it is
// removed when the request ends), and closed when the request ends,
// whether the handler returned or panicked, or the client went away in
// the middle of the body (answered 400 INVALID_REQUEST; no record is
// made). On Unix a process that dies mid-request leaves no file behind.
//
// A body within MaxRequestBody is read and fingerprinted exactly as
// without SpoolBody. A spooled body is fingerprinted by FingerprintV1's
// algorithm as raw bytes ('R', its length, its bytes): for a body that is
// not JSON (or not valid JSON) that is the fingerprint FingerprintV1
// gives it in memory, so records made without SpoolBody (with a larger
// MaxRequestBody) stay replayable. A JSON body over MaxRequestBody is not
// put in canonical form, which needs the whole text in memory: it is
// hashed byte for byte, so a retry must resend the same bytes (which a
// retry does) and a reformatted one is refused 422 KEY_MISMATCH — never
// given another request's response, since the raw and canonical forms
// are tagged apart. A record of a large JSON body stored in canonical form
// by a middleware whose MaxRequestBody was larger gets 422 on a retry
// within its retention once SpoolBody spools it: keep MaxRequestBody as it
// was when turning SpoolBody on for such a route. The hashed input gives
// the body's length before its bytes: when the request announces its
// length (Content-Length), the body is hashed while it is spooled;
// otherwise (chunked) in a second pass over the spool.
//
// Config.Fingerprint and Config.Key take the whole body as a []byte, so
// New refuses either with SpoolBody; give a route that needs them and
// large bodies a Middleware of its own (With).
//
// # Streaming and hijacking
//
// The writer the handler gets implements http.Flusher, http.Hijacker and
// Unwrap, so http.NewResponseController works (deadlines and full duplex
// reach the underlying writer). Flush sends the status, headers and body
// written so far, and the rest of the response streams as written; the
// record completes when the handler returns, keeping the body if it stayed
// within MaxResponseBody and marking it omitted otherwise. A retry never
// runs the handler again, but a client that retries while the stream is
// still running gets 409.
//
// Hijack sends what was written through WriteHeader and Write first (as
// net/http does), then hands the connection over. When the handler
// returns, the record completes with the status written before Hijack
// (200 if none), the replayable headers and no body (omitted), or is
// released if the release policy selects that status. The client may see
// the handler's answer on the connection before the record completes.
//
// # Per-route options
//
// A Middleware has one configuration. Routes that need another (a Wait,
// a smaller body limit, KeyOptional) get their own Middleware, derived with
// With; Middlewares over one store share its records, so give routes that
// share keys the same fingerprint function.
//
// # What idemhttp does not guarantee
//
//   - An effect outside the store's database and the stored response do
//     not commit together: a crash between them leaves a processing record,
//     and the retry after its lease runs the handler again. Use CompleteTx
//     or make the effect idempotent.
//   - With FailOpen, a request that arrives while the store is down runs
//     unguarded, and may run twice.
//   - A response is replayed for the record's retention (24 h by default);
//     a retry after that runs the handler again.
package idemhttp
