package steps

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

// OpConfig configures an operation (Define). Every field is optional,
// except Key for Call.
type OpConfig[I, O any] struct {
	// Key returns the scope and the idempotency key of an input, for
	// Call (Run takes them from the execution it runs in).
	Key func(in I) (scope, key string, err error)
	// Fingerprint identifies an input, for Call. Default:
	// idem.JSONFingerprint.
	Fingerprint func(in I) (idem.Fingerprint, error)
	// Input encodes the input into the journal, from which the completer
	// decodes it to resume the operation. Default: idem.JSONCodec.
	Input idem.Codec[I]
	// Output encodes the result into the record. Default: idem.JSONCodec.
	Output idem.Codec[O]
	// Encode builds the record's response from the operation's answer:
	// resp is stored and answer returned to the first caller when store
	// is true; store false releases the key (a retryable failure).
	// Default: idem.EncodeOutcome with Output (200 and the result; 422 and
	// {"code", "message"} for an idem.DefiniteError). Set it, and Decode
	// for Call, to answer in an HTTP API's own shape (a 201 and the
	// resource; a problem+json for a definite error): a replay through
	// idemhttp sends what it stored.
	Encode func(out O, err error) (resp idem.Response, answer error, store bool)
	// Decode turns a stored response back into Call's answer (a result,
	// or the definite error). Default: idem.DecodeOutcome with Output.
	Decode func(resp idem.Response, replayed bool) (O, error)
}

// Op is an operation of steps: a function whose steps are checkpointed
// under one idempotency record, so that a retry, or the completer after a
// crash, resumes it at its first step not done. Define it once, at
// start-up, in every instance that serves it or completes it.
type Op[I, O any] struct {
	r    *Runner
	name string
	fn   func(ctx context.Context, s *Run, in I) (O, error)
	cfg  OpConfig[I, O]
}

// Define defines the operation name on r: fn runs its steps (Local,
// Foreign) and returns its answer. The answer is stored in the record as
// OpConfig.Encode builds it (by default idem.EncodeOutcome's format): a
// result, or a definite error
// (idem.DefiniteError) that every retry gets again. Any other error of fn
// ends the attempt: the record is released, the journal counts the
// failure, and a retry (the client's, or the completer's after the
// backoff) runs fn again, its checkpointed steps answering from their
// checkpoints. A panic of fn is a failed attempt too: the journal counts
// it, then the panic goes on to Call's or Run's caller; the completer
// recovers it and goes on with its pass.
//
// fn must be deterministic in the steps it runs: a resumed run must ask
// for the steps it asked for before, by the same names, with the inputs
// they had (a step's name is its identity; its result is what it
// returned the first time).
func Define[I, O any](r *Runner, name string, fn func(ctx context.Context, s *Run, in I) (O, error), cfg *OpConfig[I, O]) (*Op[I, O], error) {
	if r == nil {
		return nil, errors.New("steps: Define needs a Runner")
	}
	if fn == nil {
		return nil, fmt.Errorf("steps: Define %q: nil function", name)
	}
	op := &Op[I, O]{r: r, name: name, fn: fn}
	if cfg != nil {
		op.cfg = *cfg
	}
	if op.cfg.Fingerprint == nil {
		op.cfg.Fingerprint = idem.JSONFingerprint[I]
	}
	if op.cfg.Input == nil {
		op.cfg.Input = idem.JSONCodec[I]{}
	}
	if op.cfg.Output == nil {
		op.cfg.Output = idem.JSONCodec[O]{}
	}
	if op.cfg.Encode == nil {
		op.cfg.Encode = func(out O, err error) (idem.Response, error, bool) {
			return idem.EncodeOutcome(op.cfg.Output, out, err)
		}
	}
	if op.cfg.Decode == nil {
		op.cfg.Decode = func(resp idem.Response, replayed bool) (O, error) {
			return idem.DecodeOutcome(op.cfg.Output, resp, replayed)
		}
	}
	if err := r.register(name, op); err != nil {
		return nil, err
	}
	return op, nil
}

// Name returns the operation's name.
func (op *Op[I, O]) Name() string { return op.name }

// Call runs the operation for in under its own execution of the key
// OpConfig.Key names, as idem.Func.Call does: once per key, a duplicate
// answered from the record (replayed true), idem.ErrInFlight while
// another execution runs it, idem.ErrMismatch for another input under
// the key. A first run that fails with a retryable error returns it; the
// next Call resumes after the last step checkpointed.
func (op *Op[I, O]) Call(ctx context.Context, in I) (out O, replayed bool, err error) {
	if op.cfg.Key == nil {
		return out, false, fmt.Errorf("steps: %s: Call needs OpConfig.Key", op.name)
	}
	scope, key, err := op.cfg.Key(in)
	if err != nil {
		return out, false, err
	}
	fp, err := op.cfg.Fingerprint(in)
	if err != nil {
		return out, false, err
	}
	return op.call(ctx, scope, key, fp, in)
}

// call runs the operation under a new execution of (scope, key).
func (op *Op[I, O]) call(ctx context.Context, scope, key string, fp idem.Fingerprint, in I) (out O, replayed bool, err error) {
	var (
		ran    bool
		ranOut O
		ranErr error
	)
	resp, replayed, err := op.r.g.Do(ctx, scope, key, fp, func(ctx context.Context) (idem.Response, error) {
		ran = true
		var resp idem.Response
		ranOut, resp, ranErr = op.exec(ctx, idem.FromContext(ctx), in)
		return resp, ranErr
	})
	switch {
	case !ran && err != nil:
		return out, false, err
	case !ran:
		out, err = op.cfg.Decode(resp, replayed)
		return out, replayed, err
	case err == nil:
		return ranOut, false, nil
	default:
		return ranOut, false, err
	}
}

// Run runs the operation for in inside the execution ctx carries (an
// idemhttp or idemgrpc handler's, an inbox handler's, a Func's): its key
// and fingerprint are the execution's. It completes the record itself
// with the operation's answer, in the transaction of the journal's
// Finish when the journal is a TxJournal (idemhttp then sends the
// committed answer), and returns it. A retryable error is returned as it
// is, after the journal counted it: let the execution release the key
// (idemhttp: answer 5xx), and the client's retry or the completer
// resumes the operation. Should the execution store an answer of its
// own instead (a 4xx, which idemhttp keeps), no run can finish the
// operation: the completer leaves it dead, for an operator to see.
//
// With a Journal that is no TxJournal, the record is completed with
// Execution.Complete; under idemhttp, write the same answer
// (idem.EncodeOutcome of the result) to the client.
func (op *Op[I, O]) Run(ctx context.Context, in I) (O, error) {
	x := idem.FromContext(ctx)
	if x == nil {
		var zero O
		return zero, fmt.Errorf("steps: %s: Run needs the context of an idem.Execution (use Call outside one)", op.name)
	}
	out, _, err := op.exec(ctx, x, in)
	return out, err
}

// resume implements resumer: the completer's run of a due operation.
func (op *Op[I, O]) resume(ctx context.Context, o Entry) (replayed bool, err error) {
	in, err := op.cfg.Input.Unmarshal(o.Input)
	if err != nil {
		// This instance cannot run it (another build may): dead, for an
		// operator to see, unless a run holds its key.
		return false, undecodableError{err}
	}
	var attempted bool
	defer func() {
		// exec counted the attempt and re-panicked; Do released the key.
		// The completer's process goes on: a bug in one operation must
		// not take down every instance that completes it.
		if p := recover(); p != nil {
			replayed, err = false, fmt.Errorf("%w: %s", errAttempted, panicReason(op.name, p))
		}
	}()
	_, replayed, err = op.r.g.Do(ctx, o.Scope, o.Key, o.Fingerprint, func(ctx context.Context) (idem.Response, error) {
		attempted = true
		_, resp, err := op.exec(ctx, idem.FromContext(ctx), in)
		return resp, err
	})
	var de *idem.DefiniteError
	if attempted && err != nil && !errors.As(err, &de) {
		err = fmt.Errorf("%w: %w", errAttempted, err)
	}
	return replayed, err
}

// panicReason is the failure of an attempt whose function panicked.
func panicReason(name string, p any) string {
	return fmt.Sprintf("steps: %s panicked: %v", name, p)
}

// undecodableError is resume's answer for an operation whose input
// the operation's codec cannot decode.
type undecodableError struct{ err error }

func (e undecodableError) Error() string { return "steps: decode the input: " + e.err.Error() }

// errAttempted marks the completer's attempt that ran and failed (the
// journal counted it).
var errAttempted = errors.New("steps: attempt failed")

// exec runs the operation inside x and completes x's record with its
// answer, or fails the attempt in the journal. It returns the result,
// the stored response and the error the caller answers.
func (op *Op[I, O]) exec(ctx context.Context, x *idem.Execution, in I) (out O, resp idem.Response, err error) {
	r := op.r
	l := x.Lease()
	input, err := op.cfg.Input.Marshal(in)
	if err != nil {
		return out, resp, fmt.Errorf("steps: %s: encode the input: %w", op.name, err)
	}
	res, err := r.j.Begin(ctx, l, Start{Name: op.name, Fingerprint: x.Fingerprint(), Input: input, After: r.g.Config().Lease + r.backoff(1)})
	if err != nil {
		return out, resp, fmt.Errorf("steps: %s: begin: %w", op.name, err)
	}
	s := &Run{r: r, x: x, lease: l, done: res.Checkpoints, attempt: res.Attempt, seen: make(map[string]bool)}
	bg := context.WithoutCancel(ctx)
	fail := func(reason string) (State, error) {
		return r.j.Fail(bg, l, Failure{Reason: reason, Backoff: r.backoff(res.Attempt), MaxAttempts: r.cfg.MaxAttempts})
	}
	defer func() {
		// A panic is a failed attempt: counted, with its backoff, before
		// it goes on to the caller (Guard.Do releases the key).
		if p := recover(); p != nil {
			if _, ferr := fail(panicReason(op.name, p)); ferr != nil {
				r.cfg.Logger.WarnContext(ctx, "steps: record a failed attempt", slog.String("steps.op", op.name), slog.Any(idem.LogErr, ferr))
			}
			panic(p)
		}
	}()
	out, err = op.fn(ctx, s, in)
	resp, answer, store := op.cfg.Encode(out, err)
	if !store {
		state, ferr := fail(answer.Error())
		if ferr != nil {
			// Not counted: the completer takes it up after Start.After
			// all the same.
			r.cfg.Logger.WarnContext(ctx, "steps: record a failed attempt", slog.String("steps.op", op.name), slog.Any(idem.LogErr, ferr))
		} else if state == StateDead {
			answer = fmt.Errorf("%w (steps: the operation is dead after %d attempts; an operator may retry it)", answer, res.Attempt)
		}
		return out, resp, answer
	}
	if err := op.complete(bg, x, l, resp); err != nil {
		return out, resp, errors.Join(answer, err)
	}
	return out, resp, answer
}

// complete stores resp in x's record and marks the operation done: in
// one transaction with a TxJournal.
func (op *Op[I, O]) complete(ctx context.Context, x *idem.Execution, l idem.Lease, resp idem.Response) error {
	r := op.r
	ret := x.Retention()
	if r.tj == nil {
		if err := x.CompleteRetrying(ctx, resp); err != nil {
			return err
		}
		if err := r.j.Finish(ctx, l, ret); err != nil {
			// The answer is stored: the completer settles the operation.
			r.cfg.Logger.WarnContext(ctx, "steps: mark the operation done", slog.String("steps.op", op.name), slog.Any(idem.LogErr, err))
		}
		return nil
	}
	tx, err := r.tj.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := r.tj.FinishTx(ctx, tx, l, ret); err != nil {
		return err
	}
	if err := x.CompleteTx(ctx, tx, resp); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		// It may have committed: ask.
		if _, ok, cerr := x.Committed(ctx); cerr != nil || !ok {
			return errors.Join(err, cerr, errors.New("steps: the answer was not stored"))
		}
		return nil
	}
	x.Confirm()
	return nil
}

// Run is one run of an operation: pass it to the steps.
type Run struct {
	r       *Runner
	x       *idem.Execution
	lease   idem.Lease
	done    map[string][]byte
	attempt int
	seen    map[string]bool
}

// Attempt is the run's attempt number: 1 for the first.
func (s *Run) Attempt() int { return s.attempt }

// Lease is the lease the run holds.
func (s *Run) Lease() idem.Lease { return s.lease }

// Done reports whether step was checkpointed (by this run or an earlier
// one).
func (s *Run) Done(step string) bool {
	_, ok := s.done[step]
	return ok
}

// begin checks a step's name and returns its checkpoint, if any.
func (s *Run) begin(step string) ([]byte, bool, error) {
	if err := checkName("step", step); err != nil {
		return nil, false, fmt.Errorf("steps: %w", err)
	}
	if s.seen[step] {
		return nil, false, fmt.Errorf("steps: step %q ran twice in one run (a step's name is its identity)", step)
	}
	s.seen[step] = true
	b, ok := s.done[step]
	return b, ok, nil
}

// checkName checks the name of an operation or a step (kind), which a
// journal keeps as its key: 1–255 bytes of UTF-8 with no control
// characters. It is checked before anything runs: a foreign call whose
// checkpoint the journal refused would be made again on every attempt.
func checkName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("a %s needs a name", kind)
	case len(name) > 255:
		return fmt.Errorf("%s name of %d bytes: at most 255", kind, len(name))
	case !utf8.ValidString(name):
		return fmt.Errorf("%s name %q: not UTF-8", kind, name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%s name %q: control character", kind, name)
	}
	return nil
}

// Step is a step whose result is encoded with Codec (default
// idem.JSONCodec). Local and Foreign are its methods with JSON.
type Step[T any] struct {
	// Name is the step's identity in its operation: 1–255 bytes of UTF-8
	// without control characters (a step with another name fails before
	// it runs).
	Name  string
	Codec idem.Codec[T]
	// Retry, for a local step, reports whether an error of its
	// transaction (fn's, the checkpoint's or the commit's) means that
	// the transaction rolled back and may simply run again, whole: a
	// deadlock victim, a serialisation failure (sqlstore.Retryable says
	// which). Local then runs it again at once, after a short jittered
	// pause, up to LocalTries times in all, instead of failing the
	// run's attempt. It must say false for an error after which the
	// commit may have happened. Nil: every error ends the step.
	// idem.ErrLeaseLost is never retried.
	Retry func(err error) bool
}

// LocalTries bounds how many times Local runs a step's transaction when
// Step.Retry allows running it again.
const LocalTries = 10

func (st Step[T]) codec() idem.Codec[T] {
	if st.Codec == nil {
		return idem.JSONCodec[T]{}
	}
	return st.Codec
}

// checkpointed returns the step's saved result, if it has one.
func (st Step[T]) checkpointed(s *Run) (out T, ok bool, err error) {
	b, ok, err := s.begin(st.Name)
	if err != nil || !ok {
		return out, false, err
	}
	out, err = st.codec().Unmarshal(b)
	if err != nil {
		return out, true, fmt.Errorf("steps: step %q: decode its checkpoint: %w", st.Name, err)
	}
	return out, true, nil
}

// Local runs fn in a transaction of the journal's database and commits
// its writes with the step's checkpoint, only while the run holds its
// lease: a run whose key was taken over commits nothing
// (idem.ErrLeaseLost). A step checkpointed before returns its result and
// does not run. An error of fn rolls its writes back and is returned;
// the step is not checkpointed, unless Step.Retry lets the transaction
// run again (a deadlock, a serialisation failure). The journal must be a
// TxJournal.
func (st Step[T]) Local(s *Run, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	out, ok, err := st.checkpointed(s)
	if ok || err != nil {
		return out, err
	}
	tj := s.r.tj
	if tj == nil {
		return out, fmt.Errorf("steps: step %q: a local step needs a TxJournal (sqlstore.StepJournal)", st.Name)
	}
	ctx := s.x.Context()
	for try := 1; ; try++ {
		var b []byte
		out, b, err = st.localTx(ctx, s, tj, fn)
		if err == nil {
			s.done[st.Name] = b
			return out, nil
		}
		if st.Retry == nil || try == LocalTries || errors.Is(err, idem.ErrLeaseLost) || !st.Retry(err) {
			return out, err
		}
		t := time.NewTimer(time.Duration(rand.Int64N(int64(localPause) << min(try, 6))))
		select {
		case <-ctx.Done():
			t.Stop()
			return out, err
		case <-t.C:
		}
	}
}

// localPause is the first pause's bound before Local runs a step's
// transaction again (doubled each try, with full jitter).
const localPause = time.Millisecond

// localTx runs one transaction of a local step: fn and the checkpoint,
// committed together. It returns fn's result and its encoding.
func (st Step[T]) localTx(ctx context.Context, s *Run, tj TxJournal, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (out T, b []byte, err error) {
	tx, err := tj.BeginTx(ctx)
	if err != nil {
		return out, nil, fmt.Errorf("steps: step %q: begin: %w", st.Name, err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	out, err = fn(ctx, tx)
	if err != nil {
		return out, nil, err
	}
	b, err = st.codec().Marshal(out)
	if err != nil {
		return out, nil, fmt.Errorf("steps: step %q: encode its result: %w", st.Name, err)
	}
	if err := tj.SaveTx(ctx, tx, s.lease, st.Name, b); err != nil {
		return out, nil, fmt.Errorf("steps: step %q: %w", st.Name, err)
	}
	if err := tx.Commit(); err != nil {
		// It may have committed: the next run's Begin tells.
		return out, nil, fmt.Errorf("steps: step %q: commit: %w", st.Name, err)
	}
	return out, b, nil
}

// Foreign runs fn, a call to another system, with a key derived from the
// run's lease and the step's name (idem.Lease.DeriveKey): the same on
// every run and every retry of the operation, so that the other system
// de-duplicates the call (send it as its Idempotency-Key). Its result is
// checkpointed after it returns; a step checkpointed before returns its
// result and does not run. An error of fn is returned and the step is
// not checkpointed: the next run calls again, with the same key. A run
// that dies between the call and its checkpoint calls again too, so the
// other system must de-duplicate by the key.
func (st Step[T]) Foreign(s *Run, fn func(ctx context.Context, key string) (T, error)) (T, error) {
	out, ok, err := st.checkpointed(s)
	if ok || err != nil {
		return out, err
	}
	ctx := s.x.Context()
	out, err = fn(ctx, s.lease.DeriveKey(st.Name))
	if err != nil {
		return out, err
	}
	b, err := st.codec().Marshal(out)
	if err != nil {
		return out, fmt.Errorf("steps: step %q: encode its result: %w", st.Name, err)
	}
	if err := s.r.j.Save(ctx, s.lease, st.Name, b); err != nil {
		return out, fmt.Errorf("steps: step %q: %w", st.Name, err)
	}
	s.done[st.Name] = b
	return out, nil
}

// Local is Step[T]{Name: name}.Local: a local step with a JSON result.
func Local[T any](s *Run, name string, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	return Step[T]{Name: name}.Local(s, fn)
}

// Foreign is Step[T]{Name: name}.Foreign: a foreign step with a JSON
// result.
func Foreign[T any](s *Run, name string, fn func(ctx context.Context, key string) (T, error)) (T, error) {
	return Step[T]{Name: name}.Foreign(s, fn)
}
