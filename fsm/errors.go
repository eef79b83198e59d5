package fsm

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// IllegalTransitionError reports a row that the transition may not move:
// the row's state is not among the states the target is reached from
// (Allowed), and the row stays where it is. errors.Is(err, ErrIllegal)
// holds.
type IllegalTransitionError struct {
	// ID is the row's id, as given.
	ID any
	// Current is the row's state, as read after the refused UPDATE, when
	// CurrentKnown. CurrentKnown is false when the call was refused
	// before any statement ran (no declared transition leads to Target):
	// the row's state is then unknown, and Current empty.
	Current      State
	CurrentKnown bool
	// Target is the state the call asked for.
	Target State
	// Allowed are the states the row may have left for Target: the
	// sources of the named transition (Fire), or of every declared
	// transition into Target (Transition). Empty when none leads there.
	Allowed []State
	// Version is the row's version, when CurrentKnown.
	Version int64
}

// Error says which row, in which state, to which target, and from where
// the target is allowed.
func (e *IllegalTransitionError) Error() string {
	if !e.CurrentKnown {
		if len(e.Allowed) == 0 {
			return fmt.Sprintf("fsm: illegal transition of %v to %q: no transition leads there (the row's state was not read)", e.ID, e.Target)
		}
		return fmt.Sprintf("fsm: illegal transition of %v to %q (allowed from %s; the row's state was not read)", e.ID, e.Target, quoteStates(e.Allowed))
	}
	return fmt.Sprintf("fsm: illegal transition of %v: it is in %q, and %q is allowed only from %s", e.ID, e.Current, e.Target, quoteStates(e.Allowed))
}

func quoteStates(states []State) string {
	q := make([]string, len(states))
	for i, s := range states {
		q[i] = strconv.Quote(string(s))
	}
	return strings.Join(q, ", ")
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
	// Current and Version are the row's, as read after the statement.
	Current State
	Version int64
	// Target is the state the call asked for.
	Target State
	// Expected is IfVersion's version, when HasExpected.
	Expected    int64
	HasExpected bool
}

// Error says which row, and what changed.
func (e *ConflictError) Error() string {
	msg := fmt.Sprintf("fsm: concurrent modification of %v (to %q): it is in %q at version %d", e.ID, e.Target, e.Current, e.Version)
	if e.HasExpected {
		msg += ", expected version " + strconv.FormatInt(e.Expected, 10)
	}
	return msg
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }
