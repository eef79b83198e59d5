package idem

import "errors"

// Sentinel errors. Match them with errors.Is: stores and guards wrap them
// with detail.
var (
	// ErrLeaseLost is returned by Complete, Extend and Release when the
	// record no longer belongs to the presented owner and fence: it was taken
	// over after its lease ended, completed, released or deleted. It is also
	// the cause of an execution's context when the watchdog loses the lease,
	// or when the lease may have ended with no renewal confirmed in time.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrNotFound is returned by Get, Delete and DeleteIf when no record
	// exists.
	ErrNotFound = errors.New("idem: record not found")

	// ErrRecordChanged is returned by a ConditionalDeleter's DeleteIf when
	// the record is no longer the one the caller read: another execution
	// holds or held it since (a takeover, or a new record after the one
	// read expired or was deleted). The record is left as it is.
	ErrRecordChanged = errors.New("idem: record changed")

	// ErrInvalidKey reports an idempotency key that is empty, longer than
	// MaxKeyLen bytes, not UTF-8, or holds a control character.
	ErrInvalidKey = errors.New("idem: invalid key")

	// ErrInvalidScope reports a scope longer than MaxKeyLen bytes, not UTF-8,
	// or holding a control character.
	ErrInvalidScope = errors.New("idem: invalid scope")

	// ErrInvalidFingerprint reports a fingerprint longer than MaxKeyLen
	// bytes, not UTF-8, or holding a control character.
	ErrInvalidFingerprint = errors.New("idem: invalid fingerprint")

	// ErrInFlight is returned by Guard.Do when another execution holds the
	// key's lease.
	ErrInFlight = errors.New("idem: request in flight")

	// ErrMismatch is returned by Guard.Do when the key was first used with a
	// different fingerprint.
	ErrMismatch = errors.New("idem: key reused with a different request")

	// ErrMaxExecution is the cause of an execution's context once it has run
	// for the guard's maximum execution time; the watchdog stops renewing the
	// lease then.
	ErrMaxExecution = errors.New("idem: maximum execution time exceeded")

	// ErrTxUnsupported is returned by Execution.CompleteTx when the store
	// cannot complete inside a caller's SQL transaction.
	ErrTxUnsupported = errors.New("idem: store cannot complete in a transaction")

	// ErrFinished is returned when an execution that was already completed or
	// released is asked to complete or release again. A store's CompleteTx
	// returns it (wrapped) when the record is already completed by the very
	// lease presented: an earlier completion of this execution committed (a
	// retry after its reply was lost), and the caller's transaction must roll
	// back.
	ErrFinished = errors.New("idem: execution already finished")
)
