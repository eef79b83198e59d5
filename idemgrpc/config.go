package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Metadata keys the interceptors read and write. gRPC metadata keys are
// lower case.
const (
	// MetadataKey carries the idempotency key of a call (request
	// metadata).
	MetadataKey = "idempotency-key"
	// MetadataReplayed is set to "true" in the header metadata of a
	// replayed answer (a stored message or a stored error).
	MetadataReplayed = "idempotency-replayed"
)

// Reasons of the google.rpc.ErrorInfo detail the server interceptor puts
// in the statuses it answers itself, in the domain ErrorDomain. They are
// stable: clients may switch on them.
const (
	ErrorDomain = "idem"

	// ReasonMissingKey: InvalidArgument, a covered call without an
	// idempotency-key (unless Config.KeyOptional).
	ReasonMissingKey = "IDEMPOTENCY_KEY_MISSING"
	// ReasonInvalidKey: InvalidArgument, a key that is empty, longer than
	// 255 bytes, not UTF-8, holds a control character, or is sent twice.
	ReasonInvalidKey = "IDEMPOTENCY_KEY_INVALID"
	// ReasonInvalidScope: InvalidArgument, Config.Scope returned a scope
	// idem.ValidateScope refuses.
	ReasonInvalidScope = "IDEMPOTENCY_SCOPE_INVALID"
	// ReasonInvalidRequest: InvalidArgument, the request cannot be
	// fingerprinted.
	ReasonInvalidRequest = "IDEMPOTENCY_REQUEST_INVALID"
	// ReasonKeyReused: FailedPrecondition, the key was used with another
	// request (another method or another message).
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInFlight: Aborted with a RetryInfo, a call with this key is
	// still running.
	ReasonInFlight = "IDEMPOTENCY_KEY_IN_FLIGHT"
	// ReasonStoreUnavailable: Unavailable with a RetryInfo, the store
	// cannot be reached.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonUnreadable: Internal, the key's stored answer cannot be
	// decoded (its message type is not known to this server).
	ReasonUnreadable = "IDEMPOTENCY_RECORD_UNREADABLE"
)

// DefaultRetryDelay is the retry delay of the RetryInfo detail when
// Config.RetryDelay is 0.
const DefaultRetryDelay = time.Second

// Config configures an Interceptor. The zero value of each field means
// its default; only Store is required.
type Config struct {
	// Store keeps the idempotency records. Required.
	Store idem.Store

	// Covers reports whether the unary method (its full name,
	// "/package.Service/Method") is guarded; calls of other methods pass
	// through untouched. Nil means DefaultCovers: every method but those
	// whose proto declaration says they are idempotent by themselves, and
	// the health service. Use MethodsIn for an allow-list.
	Covers func(fullMethod string) bool

	// KeyOptional lets a covered call without an idempotency-key through
	// to the handler, unguarded. False (the default) answers it
	// InvalidArgument (reason IDEMPOTENCY_KEY_MISSING). A malformed key is
	// refused either way.
	KeyOptional bool

	// Scope returns the caller's identity (tenant, account, user) from
	// the call's context (after authentication, from its peer, metadata
	// or auth info): equal keys in different scopes never meet. It must
	// derive the scope from authenticated identity, never from input the
	// caller chooses freely. Nil means "" for every call: one key space
	// shared by every caller, so one caller's key can replay another
	// caller's answer.
	//
	// An error that carries a gRPC status (status.Error, or an error
	// wrapping one) answers the call with that status; any other error
	// answers it Unauthenticated. The handler does not run.
	Scope func(ctx context.Context) (string, error)

	// Fingerprint computes the call's fingerprint from the method's full
	// name and the request. An error answers InvalidArgument (reason
	// IDEMPOTENCY_REQUEST_INVALID). Nil means FingerprintV1.
	Fingerprint func(fullMethod string, req any) (idem.Fingerprint, error)

	// Lease, MaxExecution, Retention and StoreTimeout configure the
	// idem.Guard, as in idemhttp: how long an execution holds its key
	// without renewal (renewed every third of it), how long the watchdog
	// renews it at most, how long a completed answer is replayed, and the
	// bound of each store call that acquires or ends an execution. Zero
	// means idem.DefaultLease (30 s), idem.DefaultMaxExecution (5 min),
	// idem.DefaultRetention (24 h) and idem.DefaultStoreTimeout (5 s).
	Lease, MaxExecution, Retention, StoreTimeout time.Duration
	// CompleteRetry is how long a completion that failed on a store error
	// is tried again before the caller gets its answer, as in idemhttp
	// (idem.GuardConfig.CompleteRetry). Zero means
	// idem.DefaultCompleteRetry (10 s); negative means one attempt.
	CompleteRetry time.Duration

	// Release reports whether the code a handler returned releases the
	// record (so that a retry runs the handler again) instead of storing
	// the answer. It is never asked about OK. Nil means DefaultRelease.
	//
	// Whatever Release says, an answer that tells the client to try again
	// is never stored: Unavailable, ResourceExhausted, Aborted, and any
	// status with a google.rpc.RetryInfo detail (as idemhttp never stores
	// 429, 503 or an answer with Retry-After). Stored, it would be
	// replayed for the record's retention, and a client that honours the
	// replay stops retrying.
	Release func(codes.Code) bool

	// RetryDelay is the delay the RetryInfo detail of an Aborted (in
	// flight) or Unavailable (store unreachable) answer asks a client to
	// wait. Zero means DefaultRetryDelay (1 s).
	RetryDelay time.Duration

	// FailOpen chooses what happens when the store cannot be reached to
	// acquire the key: false (the default) answers Unavailable; true runs
	// the handler unguarded (logged at warn level), at the risk of running
	// the effect twice.
	FailOpen bool

	// Types resolves the message type of a stored answer when it is
	// replayed. Nil means protoregistry.GlobalTypes, where every
	// generated message type registers itself.
	Types protoregistry.MessageTypeResolver

	// Logger receives store failures, fail-open runs, lost leases and
	// undecodable records. Nil discards them. Lines identify a key by its
	// hash (idem.key_hash) only, unless LogKeys is set.
	Logger *slog.Logger

	// LogKeys adds the scope and the key themselves (idem.scope, idem.key)
	// to the log lines that concern a key. Keys and scopes may identify
	// users or carry secrets: false, the default, logs only their hash.
	LogKeys bool

	// Observer, when set, receives one KindRequest event per covered call
	// (Start when the interceptor takes it, End with its Outcome:
	// executed, replayed, in_flight, mismatch, missing_key, invalid_key,
	// invalid_request, unauthenticated, store_error, lease_lost, released,
	// or passed for a call let through without a key under KeyOptional),
	// with Route the call's full method ("/pkg.Service/Method"), the store
	// calls made for it (KindStore, started from the context the call's
	// Start returned, which the handler also receives), and the lease
	// events of its execution. Calls of methods not covered are not
	// reported. Nil reports nothing and costs one comparison per call.
	Observer idem.Observer

	// StoreName is the Store of the events reported to Observer ("memory",
	// "sqlite", "postgres", "mysql", "redis", "tiered"). Empty means
	// idem.DefaultStoreName.
	StoreName string
}

// DefaultRelease is the release policy when Config.Release is nil. The
// codes that say the call may succeed if tried again, or that the server
// failed (the HTTP middleware releases 5xx, 408 and 429 alike), release
// the record: Unavailable, DeadlineExceeded, ResourceExhausted, Aborted,
// Internal, Unknown (which is also what a handler's plain error becomes),
// Canceled, Unimplemented and DataLoss. So do Unauthenticated and
// PermissionDenied (the HTTP middleware's 401 and 403): they refuse the
// caller's credentials, not the request, and the retry with a refreshed
// token must reach the handler, not get the stale refusal replayed. The
// definite answers are stored and replayed with their details:
// InvalidArgument, NotFound, AlreadyExists, FailedPrecondition and
// OutOfRange.
func DefaultRelease(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
		codes.Internal, codes.Unknown, codes.Canceled, codes.Unimplemented, codes.DataLoss,
		codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// retryInfoType is the type URL's suffix of a google.rpc.RetryInfo detail.
const retryInfoType = "/google.rpc.RetryInfo"

// tryAgain reports whether a handler's status tells the client to try
// again, which no release policy may store: Unavailable,
// ResourceExhausted, Aborted, or any status with a RetryInfo detail.
func tryAgain(st *status.Status) bool {
	switch st.Code() {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	for _, d := range st.Proto().GetDetails() {
		if strings.HasSuffix(d.GetTypeUrl(), retryInfoType) {
			return true
		}
	}
	return false
}

// releases reports whether a handler's status releases the record: it
// tells the client to try again, or Config.Release selects its code.
func (i *Interceptor) releases(st *status.Status) bool {
	return tryAgain(st) || i.release(st.Code())
}

// healthService is the prefix of the standard health-checking service's
// methods, which DefaultCovers leaves alone.
const healthService = "/grpc.health.v1.Health/"

// coverCache remembers DefaultCovers' answer per method.
var coverCache sync.Map // full method name → bool

// DefaultCovers is the coverage when Config.Covers is nil. It covers every
// unary method except:
//   - the methods of grpc.health.v1.Health, which load balancers call
//     without keys;
//   - a method whose proto declaration sets option idempotency_level to
//     NO_SIDE_EFFECTS or IDEMPOTENT, as a read or a put would (like GET
//     and PUT, which idemhttp passes through by default). The declaration
//     is looked up in protoregistry.GlobalFiles, where generated code
//     registers it; a method that is not registered there (a hand-written
//     grpc.ServiceDesc) is covered.
func DefaultCovers(fullMethod string) bool {
	if v, ok := coverCache.Load(fullMethod); ok {
		return v.(bool)
	}
	covered := !strings.HasPrefix(fullMethod, healthService) && !declaredIdempotent(fullMethod)
	coverCache.Store(fullMethod, covered)
	return covered
}

// declaredIdempotent reports whether the registered descriptor of
// fullMethod ("/pkg.Service/Method") declares it idempotent.
func declaredIdempotent(fullMethod string) bool {
	name, ok := strings.CutPrefix(fullMethod, "/")
	if !ok {
		return false
	}
	svc, method, ok := strings.Cut(name, "/")
	if !ok {
		return false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc + "." + method))
	if err != nil {
		return false
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return false
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil {
		return false
	}
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS, descriptorpb.MethodOptions_IDEMPOTENT:
		return true
	}
	return false
}

// MethodsIn returns a Config.Covers (or ClientConfig.Covers) that covers
// the methods named: a full method name ("/pkg.Service/Method") covers
// that method, and a service's prefix ending in '/'
// ("/pkg.Service/") every method of the service.
func MethodsIn(names ...string) func(fullMethod string) bool {
	exact := make(map[string]bool, len(names))
	var prefixes []string
	for _, n := range names {
		if strings.HasSuffix(n, "/") {
			prefixes = append(prefixes, n)
		} else {
			exact[n] = true
		}
	}
	return func(fullMethod string) bool {
		if exact[fullMethod] {
			return true
		}
		for _, p := range prefixes {
			if strings.HasPrefix(fullMethod, p) {
				return true
			}
		}
		return false
	}
}

// Interceptor guards unary gRPC methods with idempotency keys; see the
// package documentation for what it answers. Build it with New; it is
// safe for concurrent use.
type Interceptor struct {
	guard       *idem.Guard
	store       idem.Store
	log         *slog.Logger
	covers      func(string) bool
	scope       func(context.Context) (string, error)
	fingerprint func(string, any) (idem.Fingerprint, error)
	release     func(codes.Code) bool
	types       protoregistry.MessageTypeResolver
	retryDelay  time.Duration
	keyOptional bool
	failOpen    bool
	logKeys     bool
	obs         idem.Observer
	storeName   string
}

// New returns an Interceptor for cfg, which it copies. It refuses a nil
// cfg or Store and negative durations.
func New(cfg *Config) (*Interceptor, error) {
	if cfg == nil || cfg.Store == nil {
		return nil, errors.New("idemgrpc: New needs a Config with a Store")
	}
	c := *cfg
	if c.RetryDelay < 0 {
		return nil, fmt.Errorf("idemgrpc: negative RetryDelay %v", c.RetryDelay)
	}
	logger := c.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	i := &Interceptor{
		store:       c.Store,
		log:         logger,
		covers:      c.Covers,
		scope:       c.Scope,
		fingerprint: c.Fingerprint,
		release:     c.Release,
		types:       c.Types,
		retryDelay:  c.RetryDelay,
		keyOptional: c.KeyOptional,
		failOpen:    c.FailOpen,
		logKeys:     c.LogKeys,
		obs:         c.Observer,
		storeName:   c.StoreName,
	}
	if i.storeName == "" {
		i.storeName = idem.DefaultStoreName
	}
	if i.covers == nil {
		i.covers = DefaultCovers
	}
	if i.fingerprint == nil {
		i.fingerprint = FingerprintV1
	}
	if i.release == nil {
		i.release = DefaultRelease
	}
	if i.types == nil {
		i.types = protoregistry.GlobalTypes
	}
	if i.retryDelay == 0 {
		i.retryDelay = DefaultRetryDelay
	}
	guard, err := idem.NewGuard(c.Store, &idem.GuardConfig{
		Lease:         c.Lease,
		MaxExecution:  c.MaxExecution,
		Retention:     c.Retention,
		StoreTimeout:  c.StoreTimeout,
		CompleteRetry: c.CompleteRetry,
		Logger:        logger,
		Observer:      c.Observer,
		StoreName:     i.storeName,
		LogKeys:       c.LogKeys,
	})
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: %w", err)
	}
	i.guard = guard
	i.store = guard.Store() // observed, when Observer is set
	return i, nil
}
