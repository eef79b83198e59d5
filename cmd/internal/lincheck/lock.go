package lincheck

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/lock"
)

// LockOp names a call of lock.Backend.
type LockOp uint8

// The calls the lock model knows.
const (
	LockAcquire LockOp = iota + 1
	LockExtend
	LockRelease
)

func (o LockOp) String() string { return [...]string{"?", "Acquire", "Extend", "Release"}[o] }

// LockIn is a call to a lock backend.
type LockIn struct {
	Op LockOp
	window
	Name  string
	Owner string
	Fence int64 // Extend, Release
	TTL   int64 // Acquire, Extend
}

// LockOut is a lock backend's answer.
type LockOut struct {
	Unknown bool
	Err     error // nil, lock.ErrHeld or lock.ErrNotHeld
	Fence   int64 // Acquire
}

// lockState is the model's lock of one name.
type lockState struct {
	Held  bool
	Owner string
	// Fence is the holder's fence, or the last fence given; FenceKnown is
	// false after an Acquire of unknown outcome that may have given one
	// (Fence is then a lower bound of the next).
	Fence      int64
	FenceKnown bool
	// The lease's end.
	UntilLo, UntilHi int64
}

// LockModel is the sequential specification of lock.Backend, one name
// per partition: one holder at a time, fences that only grow, leases of
// at least the TTL asked; nobody is told ErrHeld by its own lock.
func LockModel(margin time.Duration) porcupineModel {
	m := lockModel{clock{int64(margin)}}
	return nondeterministic(byKey(func(in any) string { return in.(LockIn).Name }),
		lockState{FenceKnown: true}, m.step, m.describe, describeLock)
}

type lockModel struct{ clock }

func (m lockModel) step(s lockState, in LockIn, out LockOut) []lockState {
	w := in.window
	free := !s.Held || m.mayHaveCome(s.UntilLo, w)
	taken := s.Held && m.mayBeAhead(s.UntilHi, w)
	holds := s.Held && s.Owner == in.Owner && s.FenceKnown && s.Fence == in.Fence
	var next []lockState
	if out.Unknown {
		next = append(next, s)
	}
	switch in.Op {
	case LockAcquire:
		if free {
			n := lockState{Held: true, Owner: in.Owner, UntilLo: add(w.Call, in.TTL), UntilHi: add(w.Ret, in.TTL)}
			switch {
			case out.Unknown:
				n.Fence, n.FenceKnown = s.Fence+1, false
				next = append(next, n)
			case out.Err == nil && out.Fence > s.Fence:
				n.Fence, n.FenceKnown = out.Fence, true
				next = append(next, n)
			}
		}
		if taken && s.Owner != in.Owner && !out.Unknown && errors.Is(out.Err, lock.ErrHeld) {
			next = append(next, s)
		}
	case LockExtend:
		live := holds && m.mayBeAhead(s.UntilHi, w)
		ended := holds && m.mayHaveCome(s.UntilLo, w)
		e := s
		e.UntilLo, e.UntilHi = add(w.Call, in.TTL), add(w.Ret, in.TTL)
		switch {
		case out.Unknown && live:
			next = append(next, e)
		case out.Err == nil && live:
			next = append(next, e)
		case errors.Is(out.Err, lock.ErrNotHeld) && (!holds || ended):
			next = append(next, s)
		}
	case LockRelease:
		r := s
		r.Held = false
		switch {
		case out.Unknown && holds:
			next = append(next, r)
		case out.Err == nil && holds:
			next = append(next, r)
		case errors.Is(out.Err, lock.ErrNotHeld) && (!holds || m.mayHaveCome(s.UntilLo, w)):
			next = append(next, s)
		}
	}
	return next
}

func (m lockModel) describe(in LockIn, out LockOut) string {
	res := "ok"
	switch {
	case out.Unknown:
		res = "unknown"
	case out.Err != nil:
		res = out.Err.Error()
	case in.Op == LockAcquire:
		res = fmt.Sprintf("fence %d", out.Fence)
	}
	return fmt.Sprintf("%s(%s %s/%d ttl=%dms) → %s", in.Op, in.Name, short(in.Owner), in.Fence, in.TTL/1e6, res)
}

func describeLock(s lockState) string {
	if !s.Held {
		return fmt.Sprintf("free (last fence %d)", s.Fence)
	}
	return fmt.Sprintf("held by %s/%d (known %v) until [%s,%s]", short(s.Owner), s.Fence, s.FenceKnown, describeTime(s.UntilLo), describeTime(s.UntilHi))
}

// LockWorkload is a random mix of lock calls from several clients on a
// few names, with short TTLs so that leases end and are taken while the
// clients run, and calls with stale leases.
type LockWorkload struct {
	Clients, OpsPerClient, Names int             // defaults 8, 300, 4
	TTLs                         []time.Duration // default 5 ms, 30 ms, 150 ms
	Timeout, Think               time.Duration   // defaults 3 s, 4 ms
	// SplitResend records a refusal (ErrHeld, ErrNotHeld) as two calls in
	// its window: one that may have taken effect unseen, then the
	// refusal. It is for a backend whose client sends a call again after
	// its reply was lost (go-redis): the first run may have taken, moved
	// or freed the lock, and the second, after that lease ended or
	// another caller took the lock, refuses. Nobody acts on such a lock
	// (its caller was refused), but the history is not linearizable
	// without the split.
	SplitResend bool
	// MaxUnknown ends the run early once this many calls had an unknown
	// outcome (0: no limit); see StoreWorkload.MaxUnknown.
	MaxUnknown int
}

// RunLocks runs the workload against b and returns its history.
func RunLocks(ctx context.Context, b lock.Backend, w LockWorkload) (*History, map[string]int) {
	w.Clients, w.OpsPerClient, w.Names = cmp(w.Clients, 8), cmp(w.OpsPerClient, 300), cmp(w.Names, 4)
	if len(w.TTLs) == 0 {
		w.TTLs = []time.Duration{5 * time.Millisecond, 30 * time.Millisecond, 150 * time.Millisecond}
	}
	w.Timeout, w.Think = cmp(w.Timeout, 3*time.Second), cmp(w.Think, 4*time.Millisecond)
	h := NewHistory()
	prefix := "lin-" + lock.NewOwner()[:12] + "-"
	type held struct {
		name, owner string
		fence       int64
	}
	var (
		mu     sync.Mutex
		pool   []held
		counts = map[string]int{}
	)
	var unknown atomic.Int64
	call := func(client int, in LockIn, f func(ctx context.Context) (int64, error)) LockOut {
		ctx, cancel := context.WithTimeout(ctx, w.Timeout)
		defer cancel()
		in.Call = now()
		fence, err := f(ctx)
		in.Ret = now()
		out := LockOut{Err: err, Fence: fence}
		switch {
		case err == nil, errors.Is(err, lock.ErrHeld), errors.Is(err, lock.ErrNotHeld):
			if err != nil {
				out.Err = map[bool]error{true: lock.ErrHeld, false: lock.ErrNotHeld}[errors.Is(err, lock.ErrHeld)]
			}
		default:
			out = LockOut{Unknown: true}
			in.Ret = Never
			unknown.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
		if w.SplitResend && !out.Unknown && out.Err != nil {
			h.add(client, in, LockOut{Unknown: true}, in.Call, in.Ret)
		}
		h.add(client, in, out, in.Call, in.Ret)
		mu.Lock()
		counts[fmt.Sprintf("%s %s", in.Op, map[bool]string{true: "unknown", false: fmt.Sprint(out.Err)}[out.Unknown])]++
		mu.Unlock()
		return out
	}
	var wg sync.WaitGroup
	for c := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := mrand.New(mrand.NewPCG(mrand.Uint64(), uint64(c)))
			mine := map[string]held{}
			for range w.OpsPerClient {
				if w.MaxUnknown > 0 && unknown.Load() >= int64(w.MaxUnknown) {
					return
				}
				time.Sleep(time.Duration(rnd.Int64N(int64(w.Think))))
				name := fmt.Sprintf("%sn%d", prefix, rnd.IntN(w.Names))
				ttl := w.TTLs[rnd.IntN(len(w.TTLs))]
				l, ok := mine[name]
				p := rnd.Float64()
				switch {
				case ok && p < 0.5:
					if rnd.IntN(3) == 0 {
						call(c, LockIn{Op: LockRelease, Name: name, Owner: l.owner, Fence: l.fence}, func(ctx context.Context) (int64, error) {
							return 0, b.Release(ctx, name, l.owner, l.fence)
						})
						delete(mine, name)
					} else {
						call(c, LockIn{Op: LockExtend, Name: name, Owner: l.owner, Fence: l.fence, TTL: int64(ttl)}, func(ctx context.Context) (int64, error) {
							return 0, b.Extend(ctx, name, l.owner, l.fence, ttl)
						})
					}
				case p < 0.65:
					mu.Lock()
					var st held
					if len(pool) > 0 {
						st = pool[rnd.IntN(len(pool))]
					}
					mu.Unlock()
					if st.owner == "" {
						continue
					}
					if rnd.IntN(2) == 0 {
						call(c, LockIn{Op: LockRelease, Name: st.name, Owner: st.owner, Fence: st.fence}, func(ctx context.Context) (int64, error) {
							return 0, b.Release(ctx, st.name, st.owner, st.fence)
						})
					} else {
						call(c, LockIn{Op: LockExtend, Name: st.name, Owner: st.owner, Fence: st.fence, TTL: int64(ttl)}, func(ctx context.Context) (int64, error) {
							return 0, b.Extend(ctx, st.name, st.owner, st.fence, ttl)
						})
					}
				default:
					owner := lock.NewOwner()
					out := call(c, LockIn{Op: LockAcquire, Name: name, Owner: owner, TTL: int64(ttl)}, func(ctx context.Context) (int64, error) {
						return b.Acquire(ctx, name, owner, ttl)
					})
					if !out.Unknown && out.Err == nil {
						mine[name] = held{name, owner, out.Fence}
						mu.Lock()
						pool = append(pool, mine[name])
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	return h, counts
}

// cmp is v, or def when v is zero.
func cmp[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
