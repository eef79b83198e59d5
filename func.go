package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Codec turns a guarded function's result into the bytes a record keeps,
// and back when a duplicate is answered from the record.
type Codec[O any] interface {
	Marshal(out O) ([]byte, error)
	Unmarshal(b []byte) (O, error)
}

// JSONCodec is the default Codec: encoding/json.
type JSONCodec[O any] struct{}

// Marshal encodes out as JSON.
func (JSONCodec[O]) Marshal(out O) ([]byte, error) { return json.Marshal(out) }

// Unmarshal decodes JSON into a new O.
func (JSONCodec[O]) Unmarshal(b []byte) (O, error) {
	var out O
	err := json.Unmarshal(b, &out)
	return out, err
}

// DefiniteError is an outcome of a guarded function that a retry must get
// again rather than cause again: a card declined, an account closed. Func
// stores it in the record (its Code and the error's text) and answers
// every duplicate with it; any other error of the function releases the
// key, so that a retry runs the function again.
//
// Declare the outcomes once and wrap them:
//
//	var ErrDeclined = &idem.DefiniteError{Code: "card_declined"}
//	…
//	return Receipt{}, fmt.Errorf("card ending %s: %w", last4, ErrDeclined)
//
// errors.Is(err, ErrDeclined) holds for the error the function returned
// and for the one a duplicate gets from the record: two DefiniteErrors
// match when their codes are equal.
type DefiniteError struct {
	// Code names the outcome (required, stable: it is stored).
	Code string
	// Message is the text of the error the function returned, as stored;
	// empty on a declared outcome.
	Message string
	// Replayed is true on the error a duplicate got from the record.
	Replayed bool
}

func (e *DefiniteError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return "idem: definite outcome " + e.Code
}

// Is reports whether target is a DefiniteError with the same Code.
func (e *DefiniteError) Is(target error) bool {
	t, ok := target.(*DefiniteError)
	return ok && t.Code == e.Code
}

// FuncConfig configures [Wrap]. Key is required.
type FuncConfig[I, O any] struct {
	// Key returns the scope and the idempotency key of an input: a
	// message's ID, a job's business key, an event's source and sequence.
	// Inputs with the same scope and key run the function once. An error
	// is returned to the caller as it is, and the function does not run.
	Key func(in I) (scope, key string, err error)
	// Fingerprint identifies an input, so that a key reused for another
	// input is refused with ErrMismatch rather than answered with another
	// input's result. Default: SHA-256 of the input's encoding/json form
	// (struct fields in declaration order, map keys sorted), prefixed
	// "json1:". An input that cannot be encoded so needs its own.
	Fingerprint func(in I) (Fingerprint, error)
	// Codec stores results. Default: JSONCodec.
	Codec Codec[O]
}

// Func is a function guarded by a [Guard]: for each key, the function
// runs once and its result (or its [DefiniteError]) is stored; every
// later call with that key gets what was stored without running it. It
// is the Go form of an @Idempotent annotation, for jobs, consumers and
// any code that is not an HTTP handler (idemhttp guards those).
//
// A call while another execution of the key runs gets [ErrInFlight]; a
// call whose input has another fingerprint than the stored one gets
// [ErrMismatch]. An error of the function that is not a DefiniteError,
// or a panic, releases the key: a retry runs the function again. The
// function's context is the execution's: it is cancelled with cause
// [ErrLeaseLost] if the lease is lost, and [FromContext] on it returns the
// execution (for CompleteTx: the function may complete in its own SQL
// transaction; Func then returns what that transaction committed).
//
// The stored record holds StatusCode 200 and the encoded result, or
// StatusCode 422 and the DefiniteError's code and text as JSON.
type Func[I, O any] struct {
	g     *Guard
	fn    func(ctx context.Context, in I) (O, error)
	key   func(in I) (string, string, error)
	fp    func(in I) (Fingerprint, error)
	codec Codec[O]
}

// Wrap guards fn with g.
func Wrap[I, O any](g *Guard, fn func(ctx context.Context, in I) (O, error), cfg *FuncConfig[I, O]) (*Func[I, O], error) {
	switch {
	case g == nil:
		return nil, errors.New("idem: Wrap needs a Guard")
	case fn == nil:
		return nil, errors.New("idem: Wrap needs a function")
	case cfg == nil || cfg.Key == nil:
		return nil, errors.New("idem: Wrap needs FuncConfig.Key, which names the idempotency key of an input")
	}
	f := &Func[I, O]{g: g, fn: fn, key: cfg.Key, fp: cfg.Fingerprint, codec: cfg.Codec}
	if f.fp == nil {
		f.fp = JSONFingerprint[I]
	}
	if f.codec == nil {
		f.codec = JSONCodec[O]{}
	}
	return f, nil
}

// JSONFingerprint is FuncConfig's default fingerprint: SHA-256 of in's
// encoding/json form, hex, prefixed "json1:".
func JSONFingerprint[I any](in I) (Fingerprint, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return "", fmt.Errorf("idem: fingerprint of the input: %w (set FuncConfig.Fingerprint)", err)
	}
	sum := sha256.Sum256(b)
	return Fingerprint("json1:" + hex.EncodeToString(sum[:])), nil
}

// The status codes of a Func's records.
const (
	funcResult   = 200
	funcDefinite = 422
)

type storedDefinite struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Call runs the function for in once per key, or answers from the record
// (replayed is then true). The first run returns the function's own
// result and error; a duplicate gets the stored result, or a
// *DefiniteError rebuilt from the record.
//
// If the function succeeded but its result could not be stored, Call
// returns the result with the error: the effect happened, and the key is
// left to its lease (see [Guard.Do]). A result the Codec cannot encode is
// stored as the definite outcome "idem.unencodable", so that the function
// does not run again for that key.
func (f *Func[I, O]) Call(ctx context.Context, in I) (out O, replayed bool, err error) {
	scope, key, err := f.key(in)
	if err != nil {
		return out, false, err
	}
	fp, err := f.fp(in)
	if err != nil {
		return out, false, err
	}
	var (
		ran      bool  // the function ran in this call
		stored   bool  // and its outcome was handed to the store
		ranOut   O     // its result
		firstErr error // what this call answers if the outcome is stored
	)
	resp, replayed, err := f.g.Do(ctx, scope, key, fp, func(ctx context.Context) (Response, error) {
		ran = true
		var ranErr error
		ranOut, ranErr = f.fn(ctx, in)
		resp, answer, store := EncodeOutcome(f.codec, ranOut, ranErr)
		if !store {
			return Response{}, answer // released: a retry runs again
		}
		stored, firstErr = true, answer
		return resp, nil
	})
	switch {
	case !ran && err != nil: // the store failed, ErrInFlight, ErrMismatch
		return out, false, err
	case !ran: // answered from the record
		out, err := DecodeOutcome(f.codec, resp, replayed)
		return out, replayed, err
	case err == nil:
		return ranOut, false, firstErr
	case stored: // the outcome is known, but the completion failed
		return ranOut, false, errors.Join(firstErr, err)
	default: // released (or left to its lease)
		return ranOut, false, err
	}
}

// CodeUnencodable is the DefiniteError code stored for a result the
// Codec could not encode.
const CodeUnencodable = "idem.unencodable"

// ContentTyper is a Codec that names the media type of what it encodes;
// EncodeOutcome stores it as the record's Content-Type, so that a record
// replayed over HTTP (an operation of package steps run behind idemhttp)
// says what its body is.
type ContentTyper interface {
	ContentType() string
}

// ContentType is "application/json".
func (JSONCodec[O]) ContentType() string { return "application/json" }

// EncodeOutcome classifies what a guarded function returned and builds
// the response its record keeps, as [Func] does (package steps shares
// the format, so that a record answers either):
//
//   - err nil: StatusCode 200 and the result as c encodes it (with c's
//     ContentType, if it has one); answer is nil. A result c cannot
//     encode is stored as the definite outcome CodeUnencodable, and
//     answer says why.
//   - err a [DefiniteError] (or wrapping one): StatusCode 422 and JSON
//     {"code", "message"}; answer is err.
//   - any other error, or a DefiniteError without a Code (or whose Code
//     is not valid UTF-8): store is false
//     (release the key: a retry runs again); answer is the error.
func EncodeOutcome[O any](c Codec[O], out O, err error) (resp Response, answer error, store bool) {
	var de *DefiniteError
	switch {
	case err == nil:
		b, merr := c.Marshal(out)
		if merr == nil {
			resp = Response{StatusCode: funcResult, Body: b}
			if ct, ok := c.(ContentTyper); ok && ct.ContentType() != "" {
				resp.Header = map[string][]string{"Content-Type": {ct.ContentType()}}
			}
			return resp, nil, true
		}
		err = fmt.Errorf("idem: encode the result: %w (stored as the outcome %s: the function does not run again for this key)", merr, CodeUnencodable)
		de = &DefiniteError{Code: CodeUnencodable}
	case !errors.As(err, &de):
		return Response{}, err, false
	case de.Code == "" || !utf8.ValidString(de.Code):
		// A code that JSON cannot keep as it is would come back as
		// another code, which a replay's errors.Is would not match.
		return Response{}, fmt.Errorf("idem: a DefiniteError needs a Code of valid UTF-8 text, got %q; released (the error: %w)", de.Code, err), false
	}
	b, _ := json.Marshal(storedDefinite{Code: de.Code, Message: err.Error()}) // strings: cannot fail
	return Response{StatusCode: funcDefinite, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: b}, err, true
}

// DecodeOutcome turns a record that EncodeOutcome built back into the
// result, or into a *DefiniteError (with Replayed set to replayed).
func DecodeOutcome[O any](c Codec[O], resp Response, replayed bool) (out O, err error) {
	switch resp.StatusCode {
	case funcResult:
		out, err = c.Unmarshal(resp.Body)
		if err != nil {
			return out, fmt.Errorf("idem: decode the stored result: %w", err)
		}
		return out, nil
	case funcDefinite:
		var sd storedDefinite
		if err := json.Unmarshal(resp.Body, &sd); err != nil || sd.Code == "" {
			return out, fmt.Errorf("idem: decode the stored outcome: %q is not one", resp.Body)
		}
		return out, &DefiniteError{Code: sd.Code, Message: sd.Message, Replayed: replayed}
	default:
		return out, fmt.Errorf("idem: the record holds status %d, not a Func's result (is the key shared with another guard?)", resp.StatusCode)
	}
}

// Fn returns the guarded function with fn's own signature, for code that
// takes a plain function.
func (f *Func[I, O]) Fn() func(ctx context.Context, in I) (O, error) {
	return func(ctx context.Context, in I) (O, error) {
		out, _, err := f.Call(ctx, in)
		return out, err
	}
}
