package lincheck

import (
	"fmt"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/idem"
)

// StoreOp names a call of idem.Store.
type StoreOp uint8

// The calls the store model knows.
const (
	OpAcquire StoreOp = iota + 1
	OpComplete
	OpRelease
	OpExtend
	OpGet
	OpSweep
)

func (o StoreOp) String() string {
	return [...]string{"?", "Acquire", "Complete", "Release", "Extend", "Get", "Sweep"}[o]
}

// StoreIn is a call to a store: what was asked, and when.
type StoreIn struct {
	Op StoreOp
	window
	Key string // empty for Sweep
	// Acquire: the fingerprint, the lease and the retention (ns).
	// Extend: Lease is the ttl. Complete: Retention is the completion's.
	FP               string
	Lease, Retention int64
	// Complete, Release, Extend: the lease presented.
	Owner string
	Fence int64
	// Complete: the response body (unique per call of the history).
	Body string
	// Answer marks the second half of an Acquire split in two (see
	// StoreWorkload.SplitReadBack): the answer, read from the record,
	// which cannot be Acquired, nor be read from the record that the
	// call's own first half wrote.
	Answer bool
	// Seq numbers the call in its history (0: not numbered); the two
	// halves of a split Acquire share it.
	Seq uint64
}

// Errors a call may answer that the model knows.
const (
	errNone = iota
	errLeaseLost
	errNotFound
)

// StoreOut is a store's answer.
type StoreOut struct {
	// Unknown: the call failed with an error that does not say whether it
	// took effect (a lost connection, a timeout).
	Unknown bool
	Err     int // errNone, errLeaseLost, errNotFound
	// Acquire: the outcome; with Acquired, the lease.
	Outcome  idem.Outcome
	TookOver bool
	Owner    string
	Fence    int64
	Until    int64 // Acquire's and Extend's lease end
	// Acquire (every outcome) and Get: the record.
	Rec RecView
}

// RecView is what the model checks of a record a store returned.
type RecView struct {
	FP         string
	Completed  bool
	Owner      string
	Fence      int64
	LeaseUntil int64
	ExpiresAt  int64
	Body       string
}

// viewOf reads a record as the model sees it.
func viewOf(r idem.Record) RecView {
	v := RecView{
		FP:         string(r.Fingerprint),
		Completed:  r.Status == idem.StatusCompleted,
		Owner:      r.Owner,
		Fence:      r.Fence,
		LeaseUntil: r.LeaseUntil.UnixNano(),
		ExpiresAt:  r.ExpiresAt.UnixNano(),
	}
	if r.Response != nil {
		v.Body = string(r.Response.Body)
	}
	return v
}

// recState is the model's record of one key. The zero value is "no
// record". What the model cannot know exactly is an interval: the end of a
// lease granted at an instant in a call's window, say, or an owner nobody
// was told (empty until an answer reveals it).
type recState struct {
	Exists    bool
	FP        string
	Completed bool
	Owner     string // "" while unknown
	Fence     int64
	// The lease's end (processing) and the record's expiry.
	UntilLo, UntilHi int64
	ExpLo, ExpHi     int64
	Retention        int64 // the record's, for Extend
	Body             string
	// Writer is the Seq of the Acquire of unknown outcome that may have
	// written this lease, while its owner is unknown (0 once known): the
	// answer half of that very Acquire cannot have read it, as the store
	// that wrote it would have answered Acquired.
	Writer uint64
}

// StoreModelConfig says how a store may differ from the plain contract.
type StoreModelConfig struct {
	// Margin is the clock tolerance: the store's clock granularity and
	// the rounding of the times it returns (e.g. 1 ms for a store that
	// keeps milliseconds), plus the skew between its clock and the test's.
	Margin int64
	// DropsExpired: the store may forget a record on its own once it has
	// expired (Redis, whose keys carry a TTL): the next record of the key
	// starts at fence 1 again.
	DropsExpired bool
	// SendsAgain: the store's client sends a call again when its reply
	// was lost (go-redis does, MaxRetries): a Release whose first run
	// deleted the record answers ErrLeaseLost from its second.
	SendsAgain bool
}

// StoreModel is the sequential specification of idem.Store, one key per
// partition (Sweep goes into every partition).
func StoreModel(cfg StoreModelConfig) porcupine.Model {
	m := storeModel{clock{cfg.Margin}, cfg.DropsExpired, cfg.SendsAgain}
	return nondeterministic(
		byKey(func(in any) string { return in.(StoreIn).Key }),
		recState{}, m.step, m.describe, describeRec)
}

type storeModel struct {
	clock
	dropsExpired bool
	sendsAgain   bool
}

func (m storeModel) step(s recState, in StoreIn, out StoreOut) []recState {
	starts := []recState{s}
	if m.dropsExpired && s.Exists && m.mayHaveCome(s.ExpLo, in.window) {
		starts = append(starts, recState{})
	}
	var next []recState
	for _, s := range starts {
		switch in.Op {
		case OpAcquire:
			next = append(next, m.acquire(s, in, out)...)
		case OpComplete:
			next = append(next, m.complete(s, in, out)...)
		case OpRelease:
			next = append(next, m.release(s, in, out)...)
		case OpExtend:
			next = append(next, m.extend(s, in, out)...)
		case OpGet:
			next = append(next, m.get(s, in, out)...)
		case OpSweep:
			next = append(next, m.sweep(s, in)...)
		}
	}
	return next
}

// acquireBranch is one thing Acquire may do to the record.
type acquireBranch struct {
	outcome  idem.Outcome
	tookOver bool
	fence    int64 // Acquired: the new record's fence
}

func (m storeModel) acquire(s recState, in StoreIn, out StoreOut) []recState {
	w := in.window
	var branches []acquireBranch
	if !s.Exists {
		branches = append(branches, acquireBranch{idem.Acquired, false, 1})
	} else {
		if m.mayHaveCome(s.ExpLo, w) { // expired: replaced
			branches = append(branches, acquireBranch{idem.Acquired, !s.Completed, s.Fence + 1})
		}
		if m.mayBeAhead(s.ExpHi, w) { // live
			switch {
			case s.FP != in.FP:
				branches = append(branches, acquireBranch{outcome: idem.Mismatch})
			case s.Completed:
				branches = append(branches, acquireBranch{outcome: idem.Completed})
			default:
				if m.mayBeAhead(s.UntilHi, w) {
					branches = append(branches, acquireBranch{outcome: idem.InFlight})
				}
				if m.mayHaveCome(s.UntilLo, w) {
					branches = append(branches, acquireBranch{idem.Acquired, true, s.Fence + 1})
				}
			}
		}
	}
	if in.Answer { // the read-back half of a split Acquire takes nothing
		branches = slices.DeleteFunc(branches, func(b acquireBranch) bool { return b.outcome == idem.Acquired })
	}
	var next []recState
	if out.Unknown {
		next = append(next, s) // it never happened, or changed nothing
	}
	for _, b := range branches {
		if b.outcome != idem.Acquired {
			if out.Unknown {
				continue
			}
			if in.Answer && s.Owner == "" && s.Writer != 0 && s.Writer == in.Seq {
				// The record of the lease this call's write took: its
				// answer would have been Acquired.
				continue
			}
			if out.Outcome == b.outcome {
				if learnt, ok := m.learn(s, out.Rec); ok {
					next = append(next, learnt)
				}
			}
			continue
		}
		if out.Unknown {
			until := add(w.Call, in.Lease)
			next = append(next, recState{
				Exists: true, FP: in.FP, Fence: b.fence,
				UntilLo: until, UntilHi: Never,
				ExpLo: add(until, in.Retention), ExpHi: Never,
				Retention: in.Retention, Writer: in.Seq,
			})
			continue
		}
		r := out.Rec
		if out.Outcome != idem.Acquired || out.TookOver != b.tookOver || out.Fence != b.fence ||
			!m.within(out.Until, add(w.Call, in.Lease), add(w.Ret, in.Lease)) ||
			r.FP != in.FP || r.Completed || out.Owner == "" || r.Owner != out.Owner || r.Fence != b.fence ||
			!m.within(r.LeaseUntil, out.Until, out.Until) ||
			!m.within(r.ExpiresAt, add(out.Until, in.Retention), add(out.Until, in.Retention)) {
			continue
		}
		next = append(next, recState{
			Exists: true, FP: in.FP, Owner: out.Owner, Fence: b.fence,
			UntilLo: r.LeaseUntil, UntilHi: r.LeaseUntil,
			ExpLo: r.ExpiresAt, ExpHi: r.ExpiresAt,
			Retention: in.Retention,
		})
	}
	return next
}

// learn checks a record a store returned against s and returns s with
// what the record tells exactly (its owner, its times).
func (m storeModel) learn(s recState, r RecView) (recState, bool) {
	if !s.Exists || r.Fence != s.Fence || r.FP != s.FP || r.Completed != s.Completed ||
		(s.Owner != "" && r.Owner != s.Owner) || r.Owner == "" ||
		!m.within(r.ExpiresAt, s.ExpLo, s.ExpHi) {
		return s, false
	}
	s.Owner, s.Writer = r.Owner, 0
	s.ExpLo, s.ExpHi = r.ExpiresAt, r.ExpiresAt
	if s.Completed {
		if r.Body != s.Body {
			return s, false
		}
		return s, true
	}
	if !m.within(r.LeaseUntil, s.UntilLo, s.UntilHi) {
		return s, false
	}
	s.UntilLo, s.UntilHi = r.LeaseUntil, r.LeaseUntil
	return s, true
}

// holds reports whether the lease of in holds s: the processing record
// of that owner and fence. An unknown owner is nobody's: a lease whose
// grant was lost never reached a client.
func holds(s recState, in StoreIn) bool {
	return s.Exists && !s.Completed && s.Owner != "" && s.Owner == in.Owner && s.Fence == in.Fence
}

// completedBy reports whether the lease of in completed s.
func completedBy(s recState, in StoreIn) bool {
	return s.Exists && s.Completed && s.Owner == in.Owner && s.Fence == in.Fence
}

func (m storeModel) complete(s recState, in StoreIn, out StoreOut) []recState {
	held, done := holds(s, in), completedBy(s, in)
	c := s
	if held {
		c.Completed, c.Body, c.Retention = true, in.Body, in.Retention
		c.UntilLo, c.UntilHi = 0, 0
		c.ExpLo, c.ExpHi = add(in.Call, in.Retention), add(in.Ret, in.Retention)
	}
	switch {
	case out.Unknown && held:
		return []recState{s, c}
	case out.Unknown:
		return []recState{s}
	case out.Err == errNone && held:
		return []recState{c}
	case out.Err == errNone && done:
		return []recState{s}
	case out.Err == errLeaseLost && !held && !done:
		return []recState{s}
	}
	return nil
}

func (m storeModel) release(s recState, in StoreIn, out StoreOut) []recState {
	held := holds(s, in)
	switch {
	case out.Unknown && held:
		return []recState{s, {}}
	case out.Unknown:
		return []recState{s}
	case out.Err == errNone && held:
		return []recState{{}}
	case out.Err == errLeaseLost && held && m.sendsAgain:
		return []recState{{}}
	case out.Err == errLeaseLost && !held:
		return []recState{s}
	}
	return nil
}

func (m storeModel) extend(s recState, in StoreIn, out StoreOut) []recState {
	held := holds(s, in)
	switch {
	case out.Unknown && held:
		e := s
		e.UntilLo, e.UntilHi = add(in.Call, in.Lease), Never
		e.ExpLo, e.ExpHi = add(e.UntilLo, s.Retention), Never
		return []recState{s, e}
	case out.Unknown:
		return []recState{s}
	case out.Err == errNone && held:
		// The lease returned is the one extended, with its new end: a
		// caller goes on with it, and one of another owner or fence
		// could no longer complete.
		if out.Owner != in.Owner || out.Fence != in.Fence ||
			!m.within(out.Until, add(in.Call, in.Lease), add(in.Ret, in.Lease)) {
			return nil
		}
		e := s
		e.UntilLo, e.UntilHi = out.Until, out.Until
		e.ExpLo, e.ExpHi = add(out.Until, s.Retention), add(out.Until, s.Retention)
		return []recState{e}
	case out.Err == errLeaseLost && !held:
		return []recState{s}
	}
	return nil
}

func (m storeModel) get(s recState, in StoreIn, out StoreOut) []recState {
	switch {
	case out.Unknown:
		return []recState{s}
	case out.Err == errNotFound && !s.Exists:
		return []recState{s}
	case out.Err == errNone && s.Exists:
		if learnt, ok := m.learn(s, out.Rec); ok {
			return []recState{learnt}
		}
	}
	return nil
}

// sweep: the record may go if it has expired and is not a processing
// record with a live lease. Whether it must go is not checked here: a
// Sweep has a limit, shared by every key and scope.
func (m storeModel) sweep(s recState, in StoreIn) []recState {
	if s.Exists && m.mayHaveCome(s.ExpLo, in.window) && (s.Completed || m.mayHaveCome(s.UntilLo, in.window)) {
		return []recState{s, {}}
	}
	return []recState{s}
}

func (m storeModel) describe(in StoreIn, out StoreOut) string {
	var b strings.Builder
	op := in.Op.String()
	if in.Answer {
		op = "Acquire·answer"
	} else if in.Op == OpAcquire && out.Unknown && in.Ret < Never {
		op = "Acquire·write"
	}
	fmt.Fprintf(&b, "%s(%s", op, in.Key)
	switch in.Op {
	case OpAcquire:
		fmt.Fprintf(&b, " fp=%s lease=%dms ret=%dms", in.FP, in.Lease/1e6, in.Retention/1e6)
	case OpComplete:
		fmt.Fprintf(&b, " %s/%d body=%s", short(in.Owner), in.Fence, in.Body)
	case OpRelease:
		fmt.Fprintf(&b, " %s/%d", short(in.Owner), in.Fence)
	case OpExtend:
		fmt.Fprintf(&b, " %s/%d ttl=%dms", short(in.Owner), in.Fence, in.Lease/1e6)
	}
	b.WriteString(") → ")
	switch {
	case out.Unknown:
		b.WriteString("unknown")
	case out.Err == errLeaseLost:
		b.WriteString("ErrLeaseLost")
	case out.Err == errNotFound:
		b.WriteString("ErrNotFound")
	case in.Op == OpAcquire:
		fmt.Fprintf(&b, "%s", out.Outcome)
		if out.Outcome == idem.Acquired {
			fmt.Fprintf(&b, " %s/%d took=%v until=%s", short(out.Owner), out.Fence, out.TookOver, describeTime(out.Until))
		} else {
			fmt.Fprintf(&b, " %s", describeView(out.Rec))
		}
	case in.Op == OpGet:
		b.WriteString(describeView(out.Rec))
	case in.Op == OpExtend:
		b.WriteString("until=" + describeTime(out.Until))
	default:
		b.WriteString("ok")
	}
	return b.String()
}

func describeView(r RecView) string {
	st := "processing"
	if r.Completed {
		st = "completed:" + r.Body
	}
	if !r.Completed {
		st += " until=" + describeTime(r.LeaseUntil)
	}
	return fmt.Sprintf("{%s %s/%d fp=%s exp=%s}", st, short(r.Owner), r.Fence, r.FP, describeTime(r.ExpiresAt))
}

func describeRec(s recState) string {
	if !s.Exists {
		return "none"
	}
	st := "processing"
	if s.Completed {
		st = "completed:" + s.Body
	}
	owner := short(s.Owner)
	if owner == "" {
		owner = "?"
	}
	if !s.Completed {
		st += fmt.Sprintf(" until=[%s,%s]", describeTime(s.UntilLo), describeTime(s.UntilHi))
	}
	return fmt.Sprintf("{%s %s/%d fp=%s exp=[%s,%s]}", st, owner, s.Fence, s.FP, describeTime(s.ExpLo), describeTime(s.ExpHi))
}

func short(owner string) string {
	if len(owner) > 6 {
		return owner[:6]
	}
	return owner
}
