package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"
)

// Observer receives what idem's packages decide and every store call they
// make, so that metrics, traces and logs can be built outside the core
// (the idemprom and idemotel modules). An Observer's methods run on the
// goroutine of the operation they report: they must be safe for
// concurrent use, fast, and must not block or panic. A panic is not
// recovered: it goes through the operation reported, as the caller's own
// would (a record acquired is then left to its lease, as when the process
// dies). A nil Observer costs one comparison per operation.
//
// An operation that lasts (an HTTP request's guard, a store call, a
// message's handling) is reported twice: Start when it begins, with Kind,
// Op, Route and Store set, and End when it is over, with the same fields
// plus Outcome, Duration and Err. The context Start returns is the
// operation's: a tracer puts its span there, and the operations nested in
// it (the store calls of a request) start from it. Start returns ctx
// itself when it has nothing to add (a nil context is taken for ctx). An instant (a lease
// lost, a sweep's count, an outbox backlog) is reported by End alone.
type Observer interface {
	Start(ctx context.Context, e Event) context.Context
	End(ctx context.Context, e Event)
}

// Event is one operation or instant reported to an Observer. Its string
// fields are bounded labels, safe as metric labels: never a key, a scope,
// a message ID or a user ID. KeyHash identifies a key without revealing
// it, for spans and logs.
type Event struct {
	// Kind is the part of idem that reports.
	Kind Kind
	// Op is the operation within Kind, one of the Op* constants: a store
	// method, a lock or token operation, a relay's publish.
	Op string
	// Outcome is the result, one of the Outcome* constants (set on End).
	Outcome string
	// Route is the bounded name of what the operation serves: the route
	// pattern of an HTTP request ("POST /orders"), a gRPC full method, an
	// inbox's consumer group, an outbox relay's name. Empty when none.
	Route string
	// Store names the kind of store: "memory", "sqlite", "postgres",
	// "mysql", "redis", "tiered", or what a custom store calls itself.
	Store string
	// Duration is how long the operation took (set on End).
	Duration time.Duration
	// N is a count, for the events that carry one: the records a sweep
	// removed, the rows an outbox holds pending, an attempt's number.
	N int64
	// Age is an age, for the events that carry one: how long the oldest
	// pending outbox row has waited (the relay's lag).
	Age time.Duration
	// Err is the error of a failed operation (set on End).
	Err error
	// KeyHash is HashKey of the operation's scope and key (or message ID),
	// empty when it has none. It is not a label: it identifies one key in
	// a trace or a log line.
	KeyHash string
	// Headers are the headers of the message a KindInbox operation
	// handles (on Start), so that a tracer can continue the trace the
	// producer put in them. Read only; never a label.
	Headers map[string]string
}

// Kind is the part of idem an Event comes from.
type Kind uint8

// The kinds of Event.
const (
	// KindRequest: one request's idempotency decision (idemhttp,
	// idemgrpc): Outcome is one of the request outcomes.
	KindRequest Kind = iota + 1
	// KindStore: one call to a record store (Op: OpAcquire, OpComplete,
	// OpCompleteTx, OpExtend, OpRelease, OpGet, OpDelete, OpDeleteIf,
	// OpSweep);
	// Outcome OutcomeOK or OutcomeError.
	KindStore
	// KindLease: an execution's lease renewed (OutcomeRenewed), a renewal
	// that failed (OutcomeRenewFailed), or the lease lost (OutcomeLost).
	KindLease
	// KindSweep: a sweep; N is what it removed, Op what it swept
	// ("records", "tokens", "inbox", "outbox").
	KindSweep
	// KindLock: a lock acquired (OutcomeAcquired), refused because held
	// (OutcomeContended), lost (OutcomeLost) or released (OutcomeReleased);
	// Route is the lock's name only where the application's names are a
	// bounded set (the lock package leaves it empty otherwise).
	KindLock
	// KindToken: a submit token issued (Op OpIssue), consumed (Op
	// OpConsume; Outcome OutcomeConsumed, OutcomeUsed, OutcomeMismatch,
	// OutcomeInvalid), or a scope's unused tokens trimmed after an issue
	// (Op OpTrim; N the tokens removed).
	KindToken
	// KindInbox: a message handled by an inbox; Route is the consumer
	// group, Outcome OutcomeProcessed, OutcomeDuplicate, OutcomeRetried,
	// OutcomeDead or OutcomeInFlight.
	KindInbox
	// KindOutbox: a relay's batch published (Op OpPublish, N messages), or
	// its backlog measured (Op OpBacklog, N pending rows, Age the oldest's
	// wait).
	KindOutbox
)

var kindNames = [...]string{
	KindRequest: "request", KindStore: "store", KindLease: "lease", KindSweep: "sweep",
	KindLock: "lock", KindToken: "token", KindInbox: "inbox", KindOutbox: "outbox",
}

// String returns the kind's name ("request", "store", ...).
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "unknown"
}

// Operations (Event.Op).
const (
	OpAcquire    = "acquire"
	OpComplete   = "complete"
	OpCompleteTx = "complete_tx"
	OpExtend     = "extend"
	OpRelease    = "release"
	OpGet        = "get"
	OpDelete     = "delete"
	OpDeleteIf   = "delete_if"
	OpSweep      = "sweep"
	OpIssue      = "issue"
	OpConsume    = "consume"
	OpTrim       = "trim"
	OpPublish    = "publish"
	OpBacklog    = "backlog"
)

// Outcomes (Event.Outcome).
const (
	// Requests (KindRequest).
	OutcomeExecuted   = "executed"    // the handler ran and its response was stored
	OutcomeReplayed   = "replayed"    // a stored response was replayed
	OutcomeInFlight   = "in_flight"   // refused: the key is being executed (409, Aborted)
	OutcomeMismatch   = "mismatch"    // refused: the key (or a submit token) was used with another request (422)
	OutcomeMissingKey = "missing_key" // refused: a key is required (400)
	OutcomeInvalidKey = "invalid_key" // refused: the key is malformed (400)
	OutcomeStoreError = "store_error" // the store failed (503, Unavailable)
	OutcomeTooLarge   = "too_large"   // refused: the body is over the limit (413)
	// refused: the request cannot be read or fingerprinted (400), or a
	// gRPC request cannot be fingerprinted
	OutcomeInvalidRequest = "invalid_request"
	// refused: the caller cannot be identified, or its scope is invalid
	// (401, 400 INVALID_SCOPE; Unauthenticated)
	OutcomeUnauthenticated = "unauthenticated"
	OutcomeLeaseLost       = "lease_lost" // the execution's lease was lost
	OutcomeReleased        = "released"   // the handler ran and the key was released (a 5xx); a lock released
	OutcomePassed          = "passed"     // not covered: passed through unguarded

	// Store calls and other operations.
	OutcomeOK    = "ok"
	OutcomeError = "error"

	// Leases and locks.
	OutcomeRenewed     = "renewed"
	OutcomeRenewFailed = "renew_failed"
	OutcomeLost        = "lost"
	OutcomeAcquired    = "acquired"
	OutcomeContended   = "contended"

	// Tokens.
	OutcomeIssued   = "issued"
	OutcomeConsumed = "consumed"
	OutcomeUsed     = "used"
	OutcomeInvalid  = "invalid"

	// Inbox messages.
	OutcomeProcessed = "processed"
	OutcomeDuplicate = "duplicate"
	OutcomeRetried   = "retried"
	OutcomeDead      = "dead"
)

// HashKey returns a short, stable identifier of (scope, key) for traces and
// logs: the hex of the first 8 bytes of a SHA-256 over both, length
// prefixed. It does not reveal the key, and two different pairs share it
// only by chance (1 in 2⁶⁴).
func HashKey(scope, key string) string {
	// One buffer on the stack for the usual short pair, so that a key's
	// hash costs no allocation but its string.
	var stack [256]byte
	b := stack[:0]
	b = binary.BigEndian.AppendUint64(b, uint64(len(scope)))
	b = append(b, scope...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(key)))
	b = append(b, key...)
	sum := sha256.Sum256(b)
	var out [16]byte
	hex.Encode(out[:], sum[:8])
	return string(out[:])
}

// Observers returns an Observer that reports to each of obs in turn (nil
// entries are skipped), or nil when none is left.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Start(ctx context.Context, e Event) context.Context {
	for _, o := range m {
		if c := o.Start(ctx, e); c != nil {
			ctx = c
		}
	}
	return ctx
}

func (m multiObserver) End(ctx context.Context, e Event) {
	for _, o := range m {
		o.End(ctx, e)
	}
}
