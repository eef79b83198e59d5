package idem

import (
	"fmt"
	"time"
)

// Status is the state of a record.
type Status string

// The states of a record.
const (
	// StatusProcessing: an execution holds (or held) the lease.
	StatusProcessing Status = "processing"
	// StatusCompleted: the response is stored and is replayed until the
	// record expires.
	StatusCompleted Status = "completed"
)

// Fingerprint identifies the request a key was first used with, so that the
// same key with a different request can be refused. The HTTP middleware uses
// a versioned SHA-256 of the canonical request. Any string of at most
// MaxKeyLen bytes of UTF-8 without control characters works (so every
// store can keep it as text); equal strings mean "the same request", and
// the empty fingerprint is allowed.
type Fingerprint string

// Response is what a completed record replays: a status code, the replayable
// headers and the body. Outside HTTP, StatusCode and Body carry whatever
// result the work wants to hand to a duplicate.
type Response struct {
	// StatusCode is the HTTP status (or any result code outside HTTP).
	StatusCode int
	// Header holds the replayable headers, canonical names as keys. Nil and
	// empty are the same.
	Header map[string][]string
	// Body is the stored body, byte for byte. Nil and empty are the same.
	Body []byte
	// BodyOmitted marks a response whose body was too large to keep (or was
	// streamed): the status and headers are stored, the body is not, and a
	// retry never runs the effect again.
	BodyOmitted bool
}

// Clone returns a deep copy of r: its body and header values share no
// memory with r's (the values of all headers share one new backing
// array). Nil stays nil; an empty body, header or value list stays empty.
// A store uses it to keep, or to hand out, a response its caller may
// reuse.
func (r Response) Clone() Response {
	c := r
	if r.Body != nil {
		c.Body = append(make([]byte, 0, len(r.Body)), r.Body...)
	}
	if r.Header != nil {
		n := 0
		for _, values := range r.Header {
			n += len(values)
		}
		all := make([]string, n)
		c.Header = make(map[string][]string, len(r.Header))
		for name, values := range r.Header {
			if values != nil {
				m := copy(all, values)
				values, all = all[:m:m], all[m:]
			}
			c.Header[name] = values
		}
	}
	return c
}

// Record is what a store keeps for one (scope, key).
type Record struct {
	Scope       string
	Key         string
	Fingerprint Fingerprint
	Status      Status
	// Owner is the random token of the execution that holds (or held) the
	// lease.
	Owner string
	// Fence counts the acquisitions of this record: 1 when it is created,
	// + 1 on each takeover and on each replacement of an expired record by
	// Acquire. Completions, extensions and releases must present it, so
	// it refuses a stale execution of this record. It orders the
	// executions of one record only: once the record is gone (released,
	// deleted, swept, or dropped by a store's own expiry such as a Redis
	// TTL), the next record of the same (scope, key) starts at 1 again. It
	// is not a fencing token for systems downstream.
	Fence int64
	// LeaseUntil is when a processing record may be taken over.
	LeaseUntil time.Time
	// Retention is how long the record is kept after it completes, or after
	// its lease ends if it never completes.
	Retention time.Duration
	// Response is set when Status is StatusCompleted.
	Response    *Response
	CreatedAt   time.Time
	CompletedAt time.Time // zero while processing
	// ExpiresAt is when the record may be replaced or swept: CompletedAt +
	// retention for a completed record, LeaseUntil + retention for a
	// processing one.
	ExpiresAt time.Time
}

// Lease is an execution's claim on a record: present it to Complete, Extend
// and Release.
type Lease struct {
	Scope string
	Key   string
	Owner string
	// Fence is the record's fence when the lease was acquired (see
	// Record.Fence): it identifies this execution among the executions of
	// the record, not among all executions of the key.
	Fence int64
	// Until is when the lease ends, on the store's clock.
	Until time.Time
}

// Outcome says what Acquire found.
type Outcome int

// The outcomes of Acquire.
const (
	// Acquired: the caller holds the lease and must run the work.
	Acquired Outcome = iota + 1
	// InFlight: another execution holds a live lease on the key.
	InFlight
	// Completed: the key's response is stored; replay it.
	Completed
	// Mismatch: the key is bound to a request with another fingerprint.
	Mismatch
)

func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case InFlight:
		return "in-flight"
	case Completed:
		return "completed"
	case Mismatch:
		return "mismatch"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// AcquireRequest asks a store for the lease on one key.
type AcquireRequest struct {
	Scope       string
	Key         string
	Fingerprint Fingerprint
	// Lease is how long the lease lasts from the store's now; must be > 0.
	Lease time.Duration
	// Retention is how long an abandoned processing record is kept after its
	// lease ends before Sweep may remove it; must be > 0. (The retention of a
	// completed record is given to Complete.)
	Retention time.Duration
}

// Validate reports whether the request can be sent to a store.
func (r AcquireRequest) Validate() error {
	if err := ValidateScope(r.Scope); err != nil {
		return err
	}
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if err := validateText(string(r.Fingerprint), ErrInvalidFingerprint, "fingerprint"); err != nil {
		return err
	}
	if r.Lease <= 0 {
		return fmt.Errorf("idem: lease must be positive, got %v", r.Lease)
	}
	if r.Retention <= 0 {
		return fmt.Errorf("idem: retention must be positive, got %v", r.Retention)
	}
	return nil
}

// AcquireResult is the answer of Acquire. Lease is set when Outcome is
// Acquired. Record is set for every outcome: for Acquired it is the
// processing record the lease now holds, as the store wrote it (what Get
// would return), so that a caller that caches records needs no read back.
type AcquireResult struct {
	Outcome Outcome
	Lease   Lease
	Record  Record
	// TookOver reports an Acquired result that replaced a processing record
	// whose lease had ended (its fence is the old one + 1).
	TookOver bool
}
