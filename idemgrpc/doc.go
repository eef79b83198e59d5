// Package idemgrpc brings idem's exactly-once semantics to unary gRPC
// methods: a server interceptor that runs the first call with an
// idempotency key and replays its answer to every retry, and a client
// interceptor that gives calls a key and retries them with it. The
// semantics are idemhttp's, in gRPC's terms (the Example has the whole
// program):
//
//	guard, err := idemgrpc.New(&idemgrpc.Config{
//		Store: memstore.New(nil),
//		// Scope: the authenticated caller, from the context.
//	})
//	if err != nil {
//		panic(err)
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(guard.Unary))
//
// and on the client's side:
//
//	retrying, err := idemgrpc.NewClient(nil)
//	if err != nil {
//		panic(err)
//	}
//	conn, err := grpc.NewClient(lis.Addr().String(),
//		grpc.WithTransportCredentials(insecure.NewCredentials()),
//		grpc.WithChainUnaryInterceptor(retrying.Unary))
//
// Each guarded call runs under an idem.Execution (idem.FromContext(ctx)
// in the handler) whose watchdog renews its lease while the handler runs,
// as over HTTP: the lease, fencing and lease-loss rules are the
// idem.Guard's.
//
// The handler's context does not end with the caller's: a client whose
// deadline passes (or that cancels) while the handler runs does not cut
// it after its effect, which would release the key and let the retry run
// the effect again. The context keeps the call's values (metadata, peer,
// auth info) but no deadline of the caller's; it ends when the lease is
// lost or at Config.MaxExecution (5 min), with those causes. The answer
// is stored when the handler returns, and sent if the caller is still
// there; a caller's retry meanwhile gets Aborted (in flight), then the
// stored answer. A handler that calls on to other services should bound
// those calls itself. A caller that has gone before the key is acquired,
// or while it is, gets no record and no run of the handler (and, with
// Config.StoreTimeout negative, its going away ends the Acquire). Since
// the handler's context does not end with the call's, grpc.Server.Stop
// does not end a handler that is running: GracefulStop waits for it (up
// to MaxExecution); after Stop it runs on, and finds the store closed if
// the program closes it.
//
// # What the server interceptor answers
//
// Statuses the interceptor answers itself carry a
// google.rpc.ErrorInfo detail in the domain "idem" with a stable reason
// (the Reason constants), and those worth retrying a google.rpc.RetryInfo.
//
//   - A method Config.Covers leaves out passes through untouched. By
//     default every unary method is covered except the health service's
//     and those whose proto declaration sets idempotency_level
//     (DefaultCovers). Streaming methods are never intercepted.
//   - The key is the idempotency-key request metadata, validated as
//     idemhttp.ParseKey validates the Idempotency-Key header (1 to 255
//     bytes of UTF-8 without control characters; an RFC 8941 quoted
//     string is unquoted, so a key forwarded from HTTP means the same).
//     None: InvalidArgument IDEMPOTENCY_KEY_MISSING (or, with
//     Config.KeyOptional, the handler runs unguarded). Malformed, or two
//     values: InvalidArgument IDEMPOTENCY_KEY_INVALID.
//   - The scope is Config.Scope's, from the context; an error answers
//     Unauthenticated, or the gRPC status it carries.
//   - The fingerprint (FingerprintV1) is over the full method name and the
//     deterministic protobuf encoding of the request: equal messages have
//     one fingerprint whatever order their maps were filled in. It is over
//     bytes, not meaning: a double of -0.0 and one of 0.0 are two requests
//     (proto3 encodes the first, not the second), as are a proto3 optional
//     field absent and set to its default; a NaN is one request as long as
//     its retries resend its bits; unknown fields count, and since the
//     deterministic encoding puts them after the known ones, a retry that
//     lands on a server which knows a field the first server did not (a
//     rolling deploy) can get FailedPrecondition for its own request.
//   - The first call with a key runs the handler. Its answer is stored:
//     a message as its type's full name and its encoding (EncodeMessage),
//     a definite failure (InvalidArgument, NotFound, AlreadyExists,
//     FailedPrecondition, OutOfRange) as its google.rpc.Status, message
//     and details included (EncodeStatus).
//   - A retry with the same fingerprint after the first completed gets the
//     stored message or status, with idempotency-replayed: true in the
//     header metadata; the handler does not run. A stored message is
//     decoded into a new message of its type, found in Config.Types
//     (protoregistry.GlobalTypes by default, where generated types
//     register); a type this server does not know is answered Internal
//     IDEMPOTENCY_RECORD_UNREADABLE, and the handler still does not run.
//     So is a retry of a call whose handler succeeded with an answer that
//     cannot be stored (nil, or not a proto.Message): its record keeps no
//     answer, and the handler, whose effect happened, does not run again.
//   - The same key with another request (another message, or another
//     method): FailedPrecondition IDEMPOTENCY_KEY_REUSED, whether the
//     first completed or still runs. The first request still replays.
//   - A retry while the first still runs: Aborted IDEMPOTENCY_KEY_IN_FLIGHT
//     with a RetryInfo of Config.RetryDelay (1 s).
//   - A transient failure of the handler (DefaultRelease: Unavailable,
//     DeadlineExceeded, ResourceExhausted, Aborted, Internal, Unknown, a
//     plain error, Canceled, Unimplemented, DataLoss), a refusal of the
//     caller's credentials (Unauthenticated, PermissionDenied: the retry
//     with a refreshed token must run, not get the stale refusal), or a
//     panic, releases the record: a retry runs the handler again.
//     Config.Release changes the policy, except for the answers that tell
//     the client to try again (Unavailable, ResourceExhausted, Aborted,
//     any status with a RetryInfo detail), which are never stored: a
//     replayed "try again" would stop every retry.
//   - The store cannot be reached to acquire the key: Unavailable
//     IDEMPOTENCY_STORE_UNAVAILABLE with a RetryInfo (or, with
//     Config.FailOpen, the handler runs unguarded). If the answer cannot
//     be stored afterwards, it is tried again for up to the guard's
//     GuardConfig.CompleteRetry (10 s by default); if it still cannot,
//     the caller gets it, and the record is left to its lease (a retry
//     within it is answered Aborted).
//   - The lease was lost while the handler ran (another call took the key
//     over): the caller gets the answer of the execution that took it
//     over, if it completed, else Aborted.
//
// A handler whose effect is in a SQL database completes the record in its
// own transaction: idem.FromContext(ctx).CompleteTx(ctx, tx, resp) with
// resp from EncodeMessage, then retries replay what committed.
//
// Not stored: the header and trailer metadata a handler sets
// (grpc.SetHeader, grpc.SetTrailer). A replay carries only the message
// or status, and idempotency-replayed.
//
// # Observing it
//
// Config.Observer (an idem.Observer, such as idemprom's or idemotel's)
// receives one idem.KindRequest event per covered call, with Route the
// call's full method and the Outcome idemhttp reports for the same
// decision (executed, replayed, in_flight, mismatch, missing_key, ...),
// the store calls made for it as its children, and its lease events.
// Log lines identify a key by idem.key_hash unless Config.LogKeys is set.
//
// # The client interceptor
//
// Client.Unary gives a covered call without idempotency-key metadata a
// fresh random key (NewKey: 128 bits from crypto/rand) and keeps a key
// the caller set. It retries the call with that key on the codes of
// ClientConfig.Retry (DefaultRetry: Unavailable, Aborted,
// ResourceExhausted, and DeadlineExceeded while the caller's context
// lives) unless the answer is marked idempotency-replayed (the key's
// stored answer, which every retry would get again), waiting the
// answer's RetryInfo delay when it has one, else an
// exponential backoff with full jitter; it stops at MaxAttempts (5), when
// the context ends, when the next wait would outlast the context's
// deadline, or when a RetryInfo asks for more than MaxRetryDelay (30 s),
// and then returns the last answer.
//
// # What it does not do
//
// It does not make a handler's effect atomic with the stored answer
// unless the handler completes in its own transaction (see above); the
// guarantees are those of the store (see the idem README's "Choosing a
// store"). Server streams, client streams and bidirectional streams are
// not guarded.
package idemgrpc
