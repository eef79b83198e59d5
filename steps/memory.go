package steps

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// Memory is a Journal in the process's memory, for tests and for a
// single instance that may lose its operations when it stops. It fences
// its writes by reading the idempotency record from store under its own
// lock, which every write and Begin hold: a write of a stale execution
// either lands before a takeover's Begin reads the checkpoints, or finds
// the fence moved. It runs no local steps (it is no TxJournal): use
// Foreign steps, or sqlstore.StepJournal.
type Memory struct {
	store idem.Store
	now   func() time.Time

	mu  sync.Mutex
	ops map[opKey]*memOp
}

type opKey struct{ scope, key string }

type memOp struct {
	op    Entry
	steps []Checkpoint
}

var _ Journal = (*Memory)(nil)

// NewMemory returns a Memory that fences by store's records.
func NewMemory(store idem.Store) (*Memory, error) {
	if store == nil {
		return nil, errors.New("steps: NewMemory needs the idem.Store of the operations' records")
	}
	return &Memory{store: store, now: time.Now, ops: make(map[opKey]*memOp)}, nil
}

// held checks that l holds the record (processing, or completed by l
// when completed is true). m.mu held.
func (m *Memory) held(ctx context.Context, l idem.Lease, completed bool) error {
	rec, err := m.store.Get(ctx, l.Scope, l.Key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return idem.ErrLeaseLost
	case err != nil:
		return err
	case rec.Owner != l.Owner || rec.Fence != l.Fence:
		return idem.ErrLeaseLost
	case rec.Status == idem.StatusProcessing, completed && rec.Status == idem.StatusCompleted:
		return nil
	}
	return idem.ErrLeaseLost
}

// Begin implements Journal.
func (m *Memory) Begin(ctx context.Context, l idem.Lease, s Start) (Resumed, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.held(ctx, l, false); err != nil {
		return Resumed{}, err
	}
	now := m.now()
	k := opKey{l.Scope, l.Key}
	o := m.ops[k]
	if o != nil && o.op.State != StateDone && (o.op.Name != s.Name || o.op.Fingerprint != s.Fingerprint) {
		// The key was released after a failed attempt and is reused by
		// another request: the operation is unfinished, its steps may be
		// half done, and it is not to be dropped.
		return Resumed{}, fmt.Errorf("%w: the key's operation %q is %s, under another fingerprint", idem.ErrMismatch, o.op.Name, o.op.State)
	}
	if o == nil || o.op.Name != s.Name || o.op.Fingerprint != s.Fingerprint || o.op.State == StateDone {
		// New, or the key's operation is done and its record expired:
		// another operation, or this one again, from its first step.
		o = &memOp{op: Entry{Scope: l.Scope, Key: l.Key, Name: s.Name, Fingerprint: s.Fingerprint, CreatedAt: now}}
		m.ops[k] = o
	}
	o.op.Input = slices.Clone(s.Input)
	o.op.State = StateRunning
	o.op.Attempts++
	o.op.NextAt = now.Add(s.After)
	o.op.UpdatedAt = now
	o.op.ExpiresAt = time.Time{}
	r := Resumed{Checkpoints: make(map[string][]byte, len(o.steps)), Attempt: o.op.Attempts}
	for _, c := range o.steps {
		r.Checkpoints[c.Step] = slices.Clone(c.Result)
	}
	return r, nil
}

// Save implements Journal.
func (m *Memory) Save(ctx context.Context, l idem.Lease, step string, result []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.held(ctx, l, false); err != nil {
		return err
	}
	o := m.ops[opKey{l.Scope, l.Key}]
	if o == nil || o.op.State != StateRunning {
		return fmt.Errorf("steps: save %q: the operation is not running (begin it first)", step)
	}
	for _, c := range o.steps {
		if c.Step == step {
			return fmt.Errorf("%w: %q", ErrStepSaved, step)
		}
	}
	o.steps = append(o.steps, Checkpoint{Step: step, Result: slices.Clone(result), At: m.now()})
	return nil
}

// Fail implements Journal.
func (m *Memory) Fail(ctx context.Context, l idem.Lease, f Failure) (State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.held(ctx, l, false); err != nil {
		return "", err
	}
	o := m.ops[opKey{l.Scope, l.Key}]
	if o == nil || o.op.State != StateRunning {
		return "", errors.New("steps: fail: the operation is not running")
	}
	now := m.now()
	o.op.LastError, o.op.UpdatedAt = strings.ToValidUTF8(f.Reason, "\uFFFD"), now
	if o.op.Attempts >= f.MaxAttempts {
		o.op.State, o.op.NextAt = StateDead, time.Time{}
	} else {
		o.op.State, o.op.NextAt = StateWaiting, now.Add(f.Backoff)
	}
	return o.op.State, nil
}

// Finish implements Journal.
func (m *Memory) Finish(ctx context.Context, l idem.Lease, retention time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.held(ctx, l, true); err != nil {
		return err
	}
	if o := m.ops[opKey{l.Scope, l.Key}]; o != nil {
		m.done(o, retention)
	}
	return nil
}

// done marks o done. m.mu held.
func (m *Memory) done(o *memOp, retention time.Duration) {
	now := m.now()
	o.op.State, o.op.NextAt, o.op.UpdatedAt, o.op.ExpiresAt = StateDone, time.Time{}, now, now.Add(retention)
	o.steps = nil
}

// Due implements Journal.
func (m *Memory) Due(ctx context.Context, name string, limit int) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	var due []Entry
	for _, o := range m.ops {
		if o.op.Name == name && (o.op.State == StateRunning || o.op.State == StateWaiting) && !o.op.NextAt.After(now) {
			due = append(due, o.op)
		}
	}
	slices.SortFunc(due, func(a, b Entry) int { return a.NextAt.Compare(b.NextAt) })
	return cloneOps(due[:min(len(due), max(limit, 0))]), nil
}

// Postpone implements Journal.
func (m *Memory) Postpone(ctx context.Context, scope, key string, d time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o := m.ops[opKey{scope, key}]; o != nil && (o.op.State == StateRunning || o.op.State == StateWaiting) {
		o.op.NextAt = m.now().Add(d)
	}
	return nil
}

// Settle implements Journal.
func (m *Memory) Settle(ctx context.Context, seen Entry, state State, reason string, retention time.Duration) error {
	if state != StateDone && state != StateDead {
		return fmt.Errorf("steps: settle: state %q is neither done nor dead", state)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.ops[opKey{seen.Scope, seen.Key}]
	if o == nil || o.op.Fingerprint != seen.Fingerprint || o.op.State == StateDone ||
		o.op.State != seen.State || o.op.Attempts != seen.Attempts {
		return nil
	}
	if state == StateDone {
		m.done(o, retention)
		return nil
	}
	o.op.State, o.op.NextAt, o.op.LastError, o.op.UpdatedAt = StateDead, time.Time{}, strings.ToValidUTF8(reason, "\uFFFD"), m.now()
	return nil
}

// Get implements Journal.
func (m *Memory) Get(ctx context.Context, scope, key string) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.ops[opKey{scope, key}]
	if o == nil {
		return Entry{}, idem.ErrNotFound
	}
	op := cloneOps([]Entry{o.op})[0]
	for _, c := range o.steps {
		op.Checkpoints = append(op.Checkpoints, Checkpoint{Step: c.Step, Result: slices.Clone(c.Result), At: c.At})
	}
	return op, nil
}

// List implements Journal.
func (m *Memory) List(ctx context.Context, state State, limit int) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ops []Entry
	for _, o := range m.ops {
		if o.op.State == state {
			ops = append(ops, o.op)
		}
	}
	slices.SortFunc(ops, func(a, b Entry) int {
		return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key))
	})
	return cloneOps(ops[:min(len(ops), max(limit, 0))]), nil
}

// Retry implements Journal.
func (m *Memory) Retry(ctx context.Context, scope, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.ops[opKey{scope, key}]
	switch {
	case o == nil:
		return idem.ErrNotFound
	case o.op.State == StateDead:
		o.op.Attempts = 0
	case o.op.State != StateWaiting:
		return ErrNotRetryable
	}
	now := m.now()
	o.op.State, o.op.NextAt, o.op.UpdatedAt = StateWaiting, now, now
	return nil
}

// Sweep implements Journal.
func (m *Memory) Sweep(ctx context.Context, limit int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	n := 0
	for _, k := range slices.Collect(maps.Keys(m.ops)) {
		if n >= limit {
			break
		}
		if o := m.ops[k]; o.op.State == StateDone && !o.op.ExpiresAt.After(now) {
			delete(m.ops, k)
			n++
		}
	}
	return n, nil
}

func cloneOps(ops []Entry) []Entry {
	out := make([]Entry, len(ops))
	for i, o := range ops {
		o.Input = slices.Clone(o.Input)
		o.Checkpoints = nil
		out[i] = o
	}
	return out
}
