package idemgrpc

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
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
	md, _ := metadata.FromIncomingContext(ctx)
	values := md[MetadataKey]
	switch {
	case len(values) == 0 && i.keyOptional:
		return handler(ctx, req)
	case len(values) == 0:
		return nil, refusal(codes.InvalidArgument, ReasonMissingKey, 0,
			"this call needs idempotency-key metadata with a value unique to it")
	case len(values) > 1:
		return nil, refusal(codes.InvalidArgument, ReasonInvalidKey, 0,
			"the call has more than one idempotency-key value")
	}
	key, err := idemhttp.ParseKey(values[0])
	if err != nil {
		return nil, refusal(codes.InvalidArgument, ReasonInvalidKey, 0, "invalid idempotency-key: "+err.Error())
	}
	var scope string
	if i.scope != nil {
		if scope, err = i.scope(ctx); err != nil {
			i.log.DebugContext(ctx, "idemgrpc: no scope", "method", info.FullMethod, "error", err)
			if st, ok := status.FromError(err); ok && st.Code() != codes.OK && st.Code() != codes.Unknown {
				return nil, st.Err()
			}
			return nil, status.Error(codes.Unauthenticated, "the caller cannot be identified")
		}
		if err := idem.ValidateScope(scope); err != nil {
			i.log.WarnContext(ctx, "idemgrpc: invalid scope", "method", info.FullMethod, "error", err)
			return nil, refusal(codes.InvalidArgument, ReasonInvalidScope, 0,
				"the caller's identity cannot scope an idempotency key")
		}
	}
	fp, err := i.fingerprint(info.FullMethod, req)
	if err == nil {
		err = idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: 1, Retention: 1}.Validate()
	}
	if err != nil {
		i.log.WarnContext(ctx, "idemgrpc: cannot fingerprint the request", "method", info.FullMethod, "key", key, "error", err)
		return nil, refusal(codes.InvalidArgument, ReasonInvalidRequest, 0, "the request cannot be fingerprinted")
	}

	exec, res, err := i.guard.Begin(ctx, scope, key, fp)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, status.FromContextError(ctx.Err()).Err()
		case i.failOpen:
			i.log.WarnContext(ctx, "idemgrpc: store unavailable; running the handler unguarded (FailOpen)",
				"scope", scope, "key", key, "error", err)
			return handler(ctx, req)
		default:
			i.log.ErrorContext(ctx, "idemgrpc: store unavailable", "scope", scope, "key", key, "error", err)
			return nil, i.unavailable()
		}
	}
	switch res.Outcome {
	case idem.Acquired:
		if res.TookOver {
			i.log.InfoContext(ctx, "idemgrpc: took over a key whose lease ended", "scope", scope, "key", key, "fence", res.Lease.Fence)
		}
		return i.run(ctx, req, handler, exec, fp)
	case idem.Completed:
		return i.replay(ctx, res.Record)
	case idem.Mismatch:
		return nil, mismatch()
	case idem.InFlight:
		return nil, i.inFlight()
	default:
		i.log.ErrorContext(ctx, "idemgrpc: store returned an unknown outcome", "outcome", res.Outcome.String())
		return nil, i.unavailable()
	}
}

// run runs the handler under exec and ends the execution.
func (i *Interceptor) run(ctx context.Context, req any, handler grpc.UnaryHandler, exec *idem.Execution, fp idem.Fingerprint) (any, error) {
	bg := context.WithoutCancel(ctx)
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked (or called runtime.Goexit): release the key
		// so that a retry runs again, and let the panic go on.
		i.releaseExec(bg, exec)
		i.log.WarnContext(bg, "idemgrpc: handler panicked; key released", "scope", exec.Lease().Scope, "key", exec.Lease().Key)
	}()
	resp, herr := handler(exec.Context(), req)
	returned = true
	return i.finish(ctx, bg, exec, fp, resp, herr)
}

// finish ends exec after the handler returned resp and herr, and returns
// the call's answer. bg is ctx without its cancellation.
func (i *Interceptor) finish(ctx, bg context.Context, exec *idem.Execution, fp idem.Fingerprint, resp any, herr error) (any, error) {
	stored, committed, err := exec.Committed(bg)
	switch {
	case err != nil:
		// The handler completed in its transaction, and whether that
		// committed cannot be read: leave the record to its lease.
		exec.Abandon()
		i.log.ErrorContext(ctx, "idemgrpc: cannot read whether the handler's completion committed; key left to its lease",
			"scope", exec.Lease().Scope, "key", exec.Lease().Key, "error", err)
		return resp, herr
	case committed:
		// What retries will replay is what the handler committed.
		m, serr, derr := decode(stored, i.types)
		if derr != nil {
			i.log.ErrorContext(ctx, "idemgrpc: the handler committed an answer this server cannot decode",
				"scope", exec.Lease().Scope, "key", exec.Lease().Key, "error", derr)
			return resp, herr
		}
		return m, serr
	}

	var end error
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
				"scope", exec.Lease().Scope, "key", exec.Lease().Key, "type", typeName(resp), "error", eerr)
			r = omitted(codes.OK)
		}
		end = i.complete(bg, exec, r)
	} else if st := status.Convert(herr); i.release(st.Code()) {
		end = i.releaseExec(bg, exec)
	} else {
		r, eerr := EncodeStatus(st)
		if eerr != nil {
			i.log.ErrorContext(ctx, "idemgrpc: the handler's error cannot be stored; the record keeps no answer",
				"scope", exec.Lease().Scope, "key", exec.Lease().Key, "error", eerr)
			r = omitted(st.Code())
		}
		end = i.complete(bg, exec, r)
	}
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
			"scope", l.Scope, "key", l.Key, "fence", l.Fence, "winner_fence", got.Fence)
		return i.replay(ctx, got)
	default:
		attrs := []any{"scope", l.Scope, "key", l.Key, "fence", l.Fence}
		if err != nil {
			attrs = append(attrs, "error", err)
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
	err := exec.Complete(ctx, resp)
	switch {
	case err == nil, errors.Is(err, idem.ErrFinished), errors.Is(err, idem.ErrLeaseLost):
	default:
		exec.Abandon()
		i.log.ErrorContext(ctx, "idemgrpc: answer sent but not stored; key left to its lease",
			"scope", exec.Lease().Scope, "key", exec.Lease().Key, "code", codes.Code(resp.StatusCode).String(), "error", err)
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
			"scope", exec.Lease().Scope, "key", exec.Lease().Key, "error", err)
	}
	return err
}

// replay answers with a stored answer, marked in the header metadata.
func (i *Interceptor) replay(ctx context.Context, rec idem.Record) (any, error) {
	if rec.Response == nil {
		i.log.ErrorContext(ctx, "idemgrpc: completed record without an answer", "scope", rec.Scope, "key", rec.Key)
		return nil, refusal(codes.Internal, ReasonUnreadable, 0, "the answer stored for this idempotency key cannot be replayed")
	}
	m, serr, derr := decode(*rec.Response, i.types)
	if derr != nil {
		i.log.ErrorContext(ctx, "idemgrpc: cannot decode a stored answer", "scope", rec.Scope, "key", rec.Key, "error", derr)
		return nil, refusal(codes.Internal, ReasonUnreadable, 0, "the answer stored for this idempotency key cannot be replayed")
	}
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
