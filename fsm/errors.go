package fsm

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrIllegal matches an *IllegalTransitionError.
	ErrIllegal = errors.New("fsm: illegal transition")
	// ErrConflict matches a *ConflictError.
	ErrConflict = errors.New("fsm: concurrent modification")
	// ErrNotFound reports that no row has the id.
	ErrNotFound = errors.New("fsm: row not found")
	// ErrUnknownState reports a target state the machine does not declare.
	ErrUnknownState = errors.New("fsm: unknown state")
	// ErrUnknownTransition reports a transition name the machine does not
	// declare.
	ErrUnknownTransition = errors.New("fsm: unknown transition")
)

// IllegalTransitionError reports a row whose state has no transition to
// the target (or is not among the states allowed by From): the row is in
// From, and stays there. errors.Is(err, ErrIllegal) holds.
type IllegalTransitionError struct {
	// ID is the row's id, as given.
	ID any
	// From is the row's state; empty when the target has no source at all
	// (the initial state with no transition into it).
	From State
	// To is the target asked for.
	To State
	// Version is the row's version, when the row was read (zero when the
	// error was found before any statement ran).
	Version int64
}

// Error says which row, from which state, to which.
func (e *IllegalTransitionError) Error() string {
	if e.From == "" {
		return fmt.Sprintf("fsm: illegal transition of %v: no transition leads to %q", e.ID, e.To)
	}
	return fmt.Sprintf("fsm: illegal transition of %v from %q to %q", e.ID, e.From, e.To)
}

// Is reports whether target is ErrIllegal.
func (e *IllegalTransitionError) Is(target error) bool { return target == ErrIllegal }

// ConflictError reports a row that is in a state the transition may leave,
// but that the statement did not update: its version is not the one
// IfVersion expected, or it was changed by another transaction between
// the statement and the read that followed it. Read the row again and
// decide. errors.Is(err, ErrConflict) holds.
type ConflictError struct {
	// ID is the row's id, as given.
	ID any
	// State and Version are the row's, as read after the statement.
	State   State
	Version int64
	// To is the target asked for.
	To State
	// Expected is IfVersion's version, when HasExpected.
	Expected    int64
	HasExpected bool
}

// Error says which row, and what changed.
func (e *ConflictError) Error() string {
	msg := fmt.Sprintf("fsm: concurrent modification of %v (to %q): it is in %q at version %d", e.ID, e.To, e.State, e.Version)
	if e.HasExpected {
		msg += ", expected version " + strconv.FormatInt(e.Expected, 10)
	}
	return msg
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }
