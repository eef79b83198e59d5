package idemgrpc

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/keyhash"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Unary is the grpc.UnaryServerInterceptor: install it with
// grpc.ChainUnaryInterceptor(i.Unary) (or grpc.UnaryInterceptor).
func (i *Interceptor) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !i.covers(info.FullMethod) {
		return handler(ctx, req)
	}
	if i.obs != nil {
		return i.unaryObserved(ctx, req, info, handler)
	}
	return i.unary(ctx, req, info, handler, nil)
}

// callObs is what an observed call reports when it ends: the outcome and
// error, and the key once known. A nil *callObs (no Observer) records
// nothing.
type callObs struct {
	outcome string
	err     error
	kh      keyhash.Value // the key and its hash, once known
	// Context is the context of the guard's Begin, which o is: it hands
	// the key's hash to the guard without an allocation (see begin).
	context.Context
}

func (o *callObs) set(outcome string, err error) {
	if o != nil {
		o.outcome, o.err = outcome, err
	}
}

// setKey records the call's key, and computes its hash: once per call,
// for its event, its store calls' and its lease's.
func (o *callObs) setKey(scope, key string) {
	if o != nil {
		o.kh = keyhash.Value{Scope: scope, Key: key, Hash: idem.HashKey(scope, key)}
	}
}

// begin returns the context for the guard's Begin: ctx, carrying the
// key's hash when o has it.
func (o *callObs) begin(ctx context.Context) context.Context {
	if o == nil || o.kh.Hash == "" {
		return ctx
	}
	o.Context = ctx
	return o
}

// Value returns the key's hash for keyhash.CtxKey, else ctx's value.
func (o *callObs) Value(k any) any {
	if k == (keyhash.CtxKey{}) {
		return &o.kh
	}
	return o.Context.Value(k)
}

// setEnded records the outcome of an execution ended by the interceptor
// (released or completed, with err).
func (o *callObs) setEnded(released bool, exec *idem.Execution, err error) {
	switch {
	case o == nil:
	case leaseLost(exec, err):
		o.set(idem.OutcomeLeaseLost, err)
	case errors.Is(err, idem.ErrFinished), err == nil:
		if released {
			o.set(idem.OutcomeReleased, nil)
		} else {
			o.set(idem.OutcomeExecuted, nil)
		}
	default:
		// The answer was sent but could not be stored (or released): the
		// record is left to its lease.
		o.set(idem.OutcomeStoreError, err)
	}
}

var errHandlerPanicked = errors.New("idemgrpc: the handler panicked")

// unaryObserved serves a covered call, reporting it to the Observer:
// Start before anything is read, End with the outcome when the answer is
// decided (or the handler panicked: OutcomeReleased, and the panic goes
// on). The handler and the store calls run in the context Start returned.
func (i *Interceptor) unaryObserved(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	route := info.FullMethod
	ctx = i.obs.Start(ctx, idem.Event{Kind: idem.KindRequest, Route: route, Store: i.storeName})
	o := &callObs{outcome: idem.OutcomeReleased, err: errHandlerPanicked}
	t0 := time.Now()
	defer func() {
		e := idem.Event{Kind: idem.KindRequest, Route: route, Store: i.storeName, Outcome: o.outcome,
			Duration: time.Since(t0), Err: o.err}
		e.KeyHash = o.kh.Hash
		i.obs.End(ctx, e)
	}()
	return i.unary(ctx, req, info, handler, o)
}

// logKey is the attribute that identifies (scope, key) in a log line: its
// hash, and the scope and key themselves under Config.LogKeys.
func (i *Interceptor) logKey(scope, key string) slog.Attr {
	return idem.LogKey(scope, key, i.logKeys)
}

// unary guards a covered call, recording its outcome in o.
func (i *Interceptor) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, o *callObs) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md[MetadataKey]
	switch {
	case len(values) == 0 && i.keyOptional:
		o.set(idem.OutcomePassed, nil)
		return handler(ctx, req)
	case len(values) == 0:
		o.set(idem.OutcomeMissingKey, nil)
		return nil, refusal(codes.InvalidArgument, ReasonMissingKey, 0,
			"this call needs idempotency-key metadata with a value unique to it")
	case len(values) > 1:
		o.set(idem.OutcomeInvalidKey, nil)
		return nil, refusal(codes.InvalidArgument, ReasonInvalidKey, 0,
			"the call has more than one idempotency-key value")
	}
	key, err := idemhttp.ParseKey(values[0])
	if err != nil {
		o.set(idem.OutcomeInvalidKey, err)
		return nil, refusal(codes.InvalidArgument, ReasonInvalidKey, 0, "invalid idempotency-key: "+err.Error())
	}
	var scope string
	if i.scope != nil {
		if scope, err = i.scope(ctx); err != nil {
			o.set(idem.OutcomeUnauthenticated, err)
			i.log.DebugContext(ctx, "idemgrpc: no scope", slog.String(idem.LogRoute, info.FullMethod), slog.Any(idem.LogErr, err))
			if st, ok := status.FromError(err); ok && st.Code() != codes.OK && st.Code() != codes.Unknown {
				return nil, st.Err()
			}
			return nil, status.Error(codes.Unauthenticated, "the caller cannot be identified")
		}
		if err := idem.ValidateScope(scope); err != nil {
			o.set(idem.OutcomeUnauthenticated, err)
			i.log.WarnContext(ctx, "idemgrpc: invalid scope", slog.String(idem.LogRoute, info.FullMethod), slog.Any(idem.LogErr, err))
			return nil, refusal(codes.InvalidArgument, ReasonInvalidScope, 0,
				"the caller's identity cannot scope an idempotency key")
		}
	}
	o.setKey(scope, key)
	fp, err := i.fingerprint(info.FullMethod, req)
	if err == nil {
		err = idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: 1, Retention: 1}.Validate()
	}
	if err != nil {
		o.set(idem.OutcomeInvalidRequest, err)
		i.log.WarnContext(ctx, "idemgrpc: cannot fingerprint the request", slog.String(idem.LogRoute, info.FullMethod),
			i.logKey(scope, key), slog.Any(idem.LogErr, err))
		return nil, refusal(codes.InvalidArgument, ReasonInvalidRequest, 0, "the request cannot be fingerprinted")
	}

	// The execution does not end with the caller's context: once the
	// handler runs, a caller that goes away (its deadline passed, it
	// cancelled) must not cut it after its effect, which would release
	// the key and let the retry run the effect again. The handler keeps
	// the call's values (metadata, peer, auth info) and runs until it
	// returns, bounded by the lease and MaxExecution; its answer is
	// stored, and sent if the caller is still there. Until Begin returns
	// the caller's context does end Begin's: a caller that goes away
	// while the key is acquired is given no record (Begin releases it),
	// and with StoreTimeout off the Acquire is bounded by the caller.
	if err := ctx.Err(); err != nil {
		o.set(idem.OutcomeStoreError, err)
		return nil, status.FromContextError(err).Err()
	}
	bctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	exec, res, err := i.guard.Begin(o.begin(bctx), scope, key, fp)
	// stop reports false once ctx's end has started the AfterFunc; ctx
	// can be done a moment before that (its Done closes first), so ctx
	// is read too. CI caught the handler run for a caller gone in that
	// moment (TestCallerGoneDuringAcquire, once in many runs).
	if stopped := stop(); (!stopped || ctx.Err() != nil) && err == nil && exec != nil {
		// The caller went away just as Begin returned: the handler has
		// not run, the key goes back.
		i.releaseExec(context.WithoutCancel(ctx), exec)
		exec, err = nil, ctx.Err()
	}
	if err != nil {
		o.set(idem.OutcomeStoreError, err)
		switch {
		case ctx.Err() != nil:
			return nil, status.FromContextError(ctx.Err()).Err()
		case i.failOpen:
			i.log.WarnContext(ctx, "idemgrpc: store unavailable; running the handler unguarded (FailOpen)",
				i.logKey(scope, key), slog.Any(idem.LogErr, err))
			return handler(ctx, req)
		default:
			i.log.ErrorContext(ctx, "idemgrpc: store unavailable", i.logKey(scope, key), slog.Any(idem.LogErr, err))
			return nil, i.unavailable()
		}
	}
	switch res.Outcome {
	case idem.Acquired:
		if res.TookOver {
			i.log.InfoContext(ctx, "idemgrpc: took over a key whose lease ended", i.logKey(scope, key), slog.Int64(idem.LogFence, res.Lease.Fence))
		}
		return i.run(ctx, req, handler, exec, fp, o)
	case idem.Completed:
		return i.replay(ctx, res.Record, o)
	case idem.Mismatch:
		o.set(idem.OutcomeMismatch, nil)
		return nil, mismatch()
	case idem.InFlight:
		o.set(idem.OutcomeInFlight, nil)
		return nil, i.inFlight()
	default:
		o.set(idem.OutcomeStoreError, nil)
		i.log.ErrorContext(ctx, "idemgrpc: store returned an unknown outcome", slog.String(idem.LogOutcome, res.Outcome.String()))
		return nil, i.unavailable()
	}
}

// run runs the handler under exec and ends the execution.
func (i *Interceptor) run(ctx context.Context, req any, handler grpc.UnaryHandler, exec *idem.Execution, fp idem.Fingerprint, o *callObs) (any, error) {
	bg := context.WithoutCancel(ctx)
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked (or called runtime.Goexit): release the key
		// so that a retry runs again, and let the panic go on.
		i.releaseExec(bg, exec)
		i.log.WarnContext(bg, "idemgrpc: handler panicked; key released", i.logKey(exec.Lease().Scope, exec.Lease().Key))
	}()
	resp, herr := handler(exec.Context(), req)
	returned = true
	return i.finish(ctx, bg, exec, fp, resp, herr, o)
}

// finish ends exec after the handler returned resp and herr, and returns
// the call's answer. bg is ctx without its cancellation.
func (i *Interceptor) finish(ctx, bg context.Context, exec *idem.Execution, fp idem.Fingerprint, resp any, herr error, o *callObs) (any, error) {
	stored, committed, err := exec.Committed(bg)
	switch {
	case err != nil:
		// The handler completed in its transaction, and whether that
		// committed cannot be read: leave the record to its lease.
		exec.Abandon()
		o.set(idem.OutcomeStoreError, err)
		i.log.ErrorContext(ctx, "idemgrpc: cannot read whether the handler's completion committed; key left to its lease",
			i.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Any(idem.LogErr, err))
		return resp, herr
	case committed:
		// What retries will replay is what the handler committed.
		o.set(idem.OutcomeExecuted, nil)
		m, serr, derr := decode(stored, i.types)
		if derr != nil {
			i.log.ErrorContext(ctx, "idemgrpc: the handler committed an answer this server cannot decode",
				i.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Any(idem.LogErr, derr))
			return resp, herr
		}
		return m, serr
	}

	var end error
	released := false
	if herr == nil {
		m, ok := resp.(proto.Message)
		var r idem.Response
		var eerr error
		if ok {
			r, eerr = EncodeMessage(m)
		}
		if !ok || eerr != nil {
			// The handler ran, and succeeded: releasing the key would let a
			// retry run its effect again. The record keeps no answer, and
			// retries are answered Internal IDEMPOTENCY_RECORD_UNREADABLE.
			i.log.ErrorContext(ctx, "idemgrpc: the handler's response cannot be stored; the record keeps no answer",
				i.logKey(exec.Lease().Scope, exec.Lease().Key), slog.String("type", typeName(resp)), slog.Any(idem.LogErr, eerr))
			r = omitted(codes.OK)
		}
		end = i.complete(bg, exec, r)
	} else if st := status.Convert(herr); i.releases(st) {
		released = true
		end = i.releaseExec(bg, exec)
	} else {
		r, eerr := EncodeStatus(st)
		if eerr != nil {
			i.log.ErrorContext(ctx, "idemgrpc: the handler's error cannot be stored; the record keeps no answer",
				i.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Any(idem.LogErr, eerr))
			r = omitted(st.Code())
		}
		end = i.complete(bg, exec, r)
	}
	o.setEnded(released, exec, end)
	if leaseLost(exec, end) {
		return i.answerLost(ctx, bg, exec, fp, resp, herr)
	}
	return resp, herr
}

// omitted is the record of an answer with code c that cannot be stored:
// no body, marked omitted (as idemhttp marks a body it does not keep), so
// that the key is not run again and its replays say the answer is lost.
func omitted(c codes.Code) idem.Response {
	return idem.Response{StatusCode: int(c), BodyOmitted: true}
}

func typeName(v any) string {
	if v == nil {
		return "nil"
	}
	if m, ok := v.(proto.Message); ok {
		return string(m.ProtoReflect().Descriptor().FullName())
	}
	return "non-proto"
}

// leaseLost reports whether the execution lost its key to another: err,
// from ending it, is ErrLeaseLost, or ErrFinished (the handler ended it)
// with the execution cancelled for a lost lease.
func leaseLost(exec *idem.Execution, err error) bool {
	return errors.Is(err, idem.ErrLeaseLost) ||
		errors.Is(err, idem.ErrFinished) && errors.Is(context.Cause(exec.Context()), idem.ErrLeaseLost)
}

// answerLost answers the call whose execution lost its key with what a
// retry would get now, in place of the handler's answer, which no retry
// will ever replay: the answer of the execution that took the key over,
// if it completed, else Aborted (in flight).
func (i *Interceptor) answerLost(ctx, bg context.Context, exec *idem.Execution, fp idem.Fingerprint, resp any, herr error) (any, error) {
	l := exec.Lease()
	got, err := i.get(bg, l.Scope, l.Key)
	switch {
	case err == nil && got.Owner == l.Owner && got.Fence == l.Fence && got.Status == idem.StatusCompleted:
		// The handler's own completion was stored after all.
		return resp, herr
	case err == nil && got.Fingerprint == fp && got.Status == idem.StatusCompleted && got.Response != nil:
		i.log.WarnContext(ctx, "idemgrpc: lease lost; the caller gets the answer of the execution that took the key over",
			i.logKey(l.Scope, l.Key), slog.Int64(idem.LogFence, l.Fence), slog.Int64("idem.winner_fence", got.Fence))
		return i.replay(ctx, got, nil)
	default:
		attrs := []any{i.logKey(l.Scope, l.Key), slog.Int64(idem.LogFence, l.Fence)}
		if err != nil {
			attrs = append(attrs, slog.Any(idem.LogErr, err))
		}
		i.log.WarnContext(ctx, "idemgrpc: lease lost, and the key holds no answer to replay: answered Aborted", attrs...)
		return nil, i.inFlight()
	}
}

// get reads a record, bounded by the guard's StoreTimeout like the
// guard's own calls.
func (i *Interceptor) get(ctx context.Context, scope, key string) (idem.Record, error) {
	if t := i.guard.Config().StoreTimeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	return i.store.Get(ctx, scope, key)
}

// complete stores resp and ends exec; it returns the store's error (after
// logging those that are not about a lost lease).
func (i *Interceptor) complete(ctx context.Context, exec *idem.Execution, resp idem.Response) error {
	err := exec.CompleteRetrying(ctx, resp)
	switch {
	case err == nil, errors.Is(err, idem.ErrFinished), errors.Is(err, idem.ErrLeaseLost):
	default:
		exec.Abandon()
		i.log.ErrorContext(ctx, "idemgrpc: answer sent but not stored; key left to its lease",
			i.logKey(exec.Lease().Scope, exec.Lease().Key), slog.String("code", codes.Code(resp.StatusCode).String()), slog.Any(idem.LogErr, err))
	}
	return err
}

// releaseExec releases exec's record; it returns the store's error (after
// logging those that are not about a lost lease).
func (i *Interceptor) releaseExec(ctx context.Context, exec *idem.Execution) error {
	err := exec.Release(ctx)
	switch {
	case err == nil, errors.Is(err, idem.ErrFinished), errors.Is(err, idem.ErrLeaseLost):
	default:
		exec.Abandon()
		i.log.ErrorContext(ctx, "idemgrpc: cannot release the key; left to its lease",
			i.logKey(exec.Lease().Scope, exec.Lease().Key), slog.Any(idem.LogErr, err))
	}
	return err
}

// replay answers with a stored answer, marked in the header metadata.
func (i *Interceptor) replay(ctx context.Context, rec idem.Record, o *callObs) (any, error) {
	if rec.Response == nil {
		o.set(idem.OutcomeStoreError, nil)
		i.log.ErrorContext(ctx, "idemgrpc: completed record without an answer", i.logKey(rec.Scope, rec.Key))
		return nil, refusal(codes.Internal, ReasonUnreadable, 0, "the answer stored for this idempotency key cannot be replayed")
	}
	m, serr, derr := decode(*rec.Response, i.types)
	if derr != nil {
		o.set(idem.OutcomeStoreError, derr)
		i.log.ErrorContext(ctx, "idemgrpc: cannot decode a stored answer", i.logKey(rec.Scope, rec.Key), slog.Any(idem.LogErr, derr))
		return nil, refusal(codes.Internal, ReasonUnreadable, 0, "the answer stored for this idempotency key cannot be replayed")
	}
	o.set(idem.OutcomeReplayed, nil)
	// Outside a gRPC server (a direct call) there is no header to set.
	_ = grpc.SetHeader(ctx, metadata.MD{MetadataReplayed: {"true"}})
	return m, serr
}

func mismatch() error {
	return refusal(codes.FailedPrecondition, ReasonKeyReused, 0,
		"this idempotency-key was used with a different request; use a new key for a new request")
}

func (i *Interceptor) inFlight() error {
	return refusal(codes.Aborted, ReasonInFlight, i.retryDelay,
		"a call with this idempotency-key is still being processed; retry later with the same key")
}

func (i *Interceptor) unavailable() error {
	return refusal(codes.Unavailable, ReasonStoreUnavailable, i.retryDelay,
		"the idempotency store cannot be reached; retry later with the same idempotency-key")
}

// refusal is an answer of the interceptor's own: a status with an
// ErrorInfo detail (reason, ErrorDomain) and, when retry is positive, a
// RetryInfo detail.
func refusal(code codes.Code, reason string, retry time.Duration, msg string) error {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st := status.New(code, msg)
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}
