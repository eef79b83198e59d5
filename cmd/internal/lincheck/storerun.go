package lincheck

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// StoreWorkload is a random mix of Store calls from several clients on a
// few keys of one scope: acquisitions with short leases and retentions
// (so that leases end, records expire, are taken over, replaced and
// swept while the clients run), completions, releases and extensions of
// the leases the clients hold and of stale ones (held by another client,
// or taken over since), reads, and sweeps. A completion whose outcome was
// unknown is retried with the same lease, as a guard does.
type StoreWorkload struct {
	Clients      int             // default 8
	OpsPerClient int             // default 400
	Keys         int             // default 6
	Leases       []time.Duration // default 5 ms, 30 ms, 150 ms
	Retentions   []time.Duration // default 30 ms, 100 ms, 400 ms
	// MaxUnknown ends the run early, once this many calls that change
	// the store (not reads) had an unknown outcome (0: no limit). Each
	// such call may take effect at any later point, and porcupine's
	// search grows with them: a server that fails most calls for a while
	// (a PostgreSQL connection's setup is several round trips, any of
	// which a fault breaks) would otherwise give a history too costly to
	// decide.
	MaxUnknown int
	// Timeout bounds each call (default 3 s): a call that runs out has an
	// unknown outcome.
	Timeout time.Duration
	// Think is the longest pause between two calls of a client (default
	// 4 ms).
	Think time.Duration
	// Sweep lets the clients call Sweep (which removes expired records of
	// every scope of the store).
	Sweep bool
	// Seed makes the choices reproducible (0: random).
	Seed uint64
	// SplitReadBack records every Acquire as two calls in the same
	// window: a write that may have taken the key under a lease nobody
	// was told of, then the Acquire (an answer other than Acquired is
	// read from the record). It is for a store whose Acquire writes and
	// then reads the record back in two statements (sqlstore on MySQL):
	// when the lease it wrote ends and is taken over (or swept) between
	// the two, it answers from the record it then reads, or tries again.
	// No effect can run twice from this (nobody held the lost lease), but
	// the history is not linearizable without the split.
	SplitReadBack bool
	// SplitResend records every Extend, Release and Complete that got an
	// answer as two calls in its window: one that may have acted unseen,
	// then the answer. It is for a store whose client sends a call again
	// after its reply was lost (go-redis, MaxRetries): the first run
	// acted (an Extend moved the lease, and a read saw that end), and
	// the second acts again (moves it once more) or, after a takeover,
	// refuses. Each run is one the store would accept alone.
	SplitResend bool
}

func (w *StoreWorkload) defaults() {
	if w.Clients <= 0 {
		w.Clients = 8
	}
	if w.OpsPerClient <= 0 {
		w.OpsPerClient = 400
	}
	if w.Keys <= 0 {
		w.Keys = 6
	}
	if len(w.Leases) == 0 {
		w.Leases = []time.Duration{5 * time.Millisecond, 30 * time.Millisecond, 150 * time.Millisecond}
	}
	if len(w.Retentions) == 0 {
		w.Retentions = []time.Duration{30 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond}
	}
	if w.Timeout <= 0 {
		w.Timeout = 3 * time.Second
	}
	if w.Think <= 0 {
		w.Think = 4 * time.Millisecond
	}
	if w.Seed == 0 {
		w.Seed = mrand.Uint64()
	}
}

// StoreStats counts what a workload's calls answered.
type StoreStats struct {
	Calls, Unknown                           int
	Acquired, TookOver, Replayed, InFlight   int
	Mismatch, Completed, LeaseLost, Released int
	Swept                                    int
	// Errors counts the errors of the calls of unknown outcome, by their
	// text with digits left out (addresses and ports vary).
	Errors map[string]int
}

func (s StoreStats) String() string {
	out := fmt.Sprintf("%d calls (%d unknown): %d acquired (%d taken over), %d replayed, %d in flight, %d mismatched, %d completed, %d released, %d lease lost, %d swept",
		s.Calls, s.Unknown, s.Acquired, s.TookOver, s.Replayed, s.InFlight, s.Mismatch, s.Completed, s.Released, s.LeaseLost, s.Swept)
	type kind struct {
		text string
		n    int
	}
	var kinds []kind
	for text, n := range s.Errors {
		kinds = append(kinds, kind{text, n})
	}
	slices.SortFunc(kinds, func(a, b kind) int { return b.n - a.n })
	for i, k := range kinds {
		if i == 4 {
			out += fmt.Sprintf("; %d more kinds of error", len(kinds)-i)
			break
		}
		out += fmt.Sprintf("; %d× %q", k.n, k.text)
	}
	return out
}

// errorKind is err's text without digits, cut to 120 bytes.
func errorKind(err error) string {
	b := []byte(err.Error())
	b = slices.DeleteFunc(b, func(c byte) bool { return c >= '0' && c <= '9' })
	return string(b[:min(len(b), 120)])
}

// RunStore runs the workload against store and returns the history of
// its calls, for StoreModel.
func RunStore(ctx context.Context, store idem.Store, w StoreWorkload) (*History, StoreStats) {
	w.defaults()
	h := NewHistory()
	var b [6]byte
	_, _ = rand.Read(b[:])
	scope := "lin-" + hex.EncodeToString(b[:])
	keys := make([]string, w.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	r := &storeRunner{w: w, store: store, h: h, scope: scope, keys: keys}
	var wg sync.WaitGroup
	for c := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.client(ctx, c, mrand.New(mrand.NewPCG(w.Seed, uint64(c))))
		}()
	}
	wg.Wait()
	return h, r.stats
}

type storeRunner struct {
	w     StoreWorkload
	store idem.Store
	h     *History
	scope string
	keys  []string

	seq     atomic.Uint64 // the last StoreIn.Seq given
	unknown atomic.Int64  // calls of unknown outcome that may have written

	mu     sync.Mutex
	leases []idem.Lease // every lease granted, for stale calls
	stats  StoreStats
}

func (r *storeRunner) count(f func(s *StoreStats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

func (r *storeRunner) client(ctx context.Context, id int, rnd *mrand.Rand) {
	held := map[string]idem.Lease{}
	var retry []StoreIn // completions of unknown outcome, to retry
	for n := range r.w.OpsPerClient {
		if ctx.Err() != nil || (r.w.MaxUnknown > 0 && r.unknown.Load() >= int64(r.w.MaxUnknown)) {
			return
		}
		if d := rnd.Int64N(int64(r.w.Think)); d > 0 {
			time.Sleep(time.Duration(d))
		}
		key := r.keys[rnd.IntN(len(r.keys))]
		l, holds := held[key]
		p := rnd.Float64()
		switch {
		case len(retry) > 0 && p < 0.3:
			in := retry[0]
			retry = retry[1:]
			if r.complete(ctx, id, in) {
				retry = append(retry, in)
			}
		case holds && p < 0.45:
			switch q := rnd.IntN(12); {
			case q < 6:
				in := StoreIn{Op: OpComplete, Key: key, Owner: l.Owner, Fence: l.Fence,
					Retention: int64(r.pick(rnd, r.w.Retentions)), Body: fmt.Sprintf("c%d-%d", id, n)}
				if r.complete(ctx, id, in) {
					retry = append(retry, in)
				}
				delete(held, key)
			case q < 9:
				if nl, ok := r.extend(ctx, id, l, r.pick(rnd, r.w.Leases)); ok {
					held[key] = nl
				}
			case q < 10:
				r.release(ctx, id, l)
				delete(held, key)
			default: // abandoned: its lease ends, another client takes over
				delete(held, key)
			}
		case p < 0.72:
			r.get(ctx, id, key)
		case p < 0.82:
			r.mu.Lock()
			var stale idem.Lease
			if len(r.leases) > 0 {
				stale = r.leases[rnd.IntN(len(r.leases))]
			}
			r.mu.Unlock()
			if stale.Owner == "" {
				continue
			}
			switch rnd.IntN(3) {
			case 0:
				in := StoreIn{Op: OpComplete, Key: stale.Key, Owner: stale.Owner, Fence: stale.Fence,
					Retention: int64(r.pick(rnd, r.w.Retentions)), Body: fmt.Sprintf("s%d-%d", id, n)}
				r.complete(ctx, id, in)
			case 1:
				r.extend(ctx, id, stale, r.pick(rnd, r.w.Leases))
			default:
				r.release(ctx, id, stale)
			}
		case p < 0.85 && r.w.Sweep:
			r.sweep(ctx, id)
		default:
			fp := "A"
			if rnd.IntN(10) == 0 {
				fp = "B"
			}
			if nl, ok := r.acquire(ctx, id, key, fp, r.pick(rnd, r.w.Leases), r.pick(rnd, r.w.Retentions)); ok {
				held[key] = nl
			}
		}
	}
	// Leave no completion unknown that a retry can settle.
	for _, in := range retry {
		r.complete(ctx, id, in)
	}
}

func (r *storeRunner) pick(rnd *mrand.Rand, ds []time.Duration) time.Duration {
	return ds[rnd.IntN(len(ds))]
}

// call runs f with the workload's timeout and records it: an error that
// is not one the model knows makes the outcome unknown.
func (r *storeRunner) call(ctx context.Context, client int, in StoreIn, f func(ctx context.Context) (StoreOut, error)) StoreOut {
	ctx, cancel := context.WithTimeout(ctx, r.w.Timeout)
	defer cancel()
	in.Seq = r.seq.Add(1)
	in.Call = now()
	out, err := f(ctx)
	in.Ret = now()
	switch {
	case err == nil:
	case errors.Is(err, idem.ErrLeaseLost):
		out = StoreOut{Err: errLeaseLost}
	case errors.Is(err, idem.ErrNotFound) && in.Op == OpGet:
		out = StoreOut{Err: errNotFound}
	default:
		out = StoreOut{Unknown: true}
		in.Ret = Never
		kind := errorKind(err)
		r.count(func(s *StoreStats) {
			if s.Errors == nil {
				s.Errors = map[string]int{}
			}
			s.Errors[kind]++
		})
	}
	if out.Unknown {
		// Let a fault pass rather than pile up calls of unknown outcome,
		// each of which the checker must try at every later point.
		time.Sleep(20 * time.Millisecond)
		if in.Op == OpGet {
			// A read that failed changed nothing: leave it out.
			r.count(func(s *StoreStats) { s.Calls++; s.Unknown++ })
			return out
		}
		r.unknown.Add(1)
	}
	if r.w.SplitReadBack && in.Op == OpAcquire && !out.Unknown {
		r.h.add(client, in, StoreOut{Unknown: true}, in.Call, in.Ret)
		in.Answer = out.Outcome != idem.Acquired
	}
	if r.w.SplitResend && !out.Unknown && (in.Op == OpExtend || in.Op == OpRelease || in.Op == OpComplete) {
		r.h.add(client, in, StoreOut{Unknown: true}, in.Call, in.Ret)
	}
	r.h.add(client, in, out, in.Call, in.Ret)
	r.count(func(s *StoreStats) {
		s.Calls++
		if out.Unknown {
			s.Unknown++
		}
		if out.Err == errLeaseLost {
			s.LeaseLost++
		}
	})
	return out
}

func (r *storeRunner) acquire(ctx context.Context, client int, key, fp string, lease, retention time.Duration) (idem.Lease, bool) {
	in := StoreIn{Op: OpAcquire, Key: key, FP: fp, Lease: int64(lease), Retention: int64(retention)}
	var got idem.Lease
	out := r.call(ctx, client, in, func(ctx context.Context) (StoreOut, error) {
		res, err := r.store.Acquire(ctx, idem.AcquireRequest{Scope: r.scope, Key: key,
			Fingerprint: idem.Fingerprint(fp), Lease: lease, Retention: retention})
		if err != nil {
			return StoreOut{}, err
		}
		got = res.Lease
		out := StoreOut{Outcome: res.Outcome, TookOver: res.TookOver, Owner: res.Lease.Owner,
			Fence: res.Lease.Fence, Until: res.Lease.Until.UnixNano(), Rec: viewOf(res.Record)}
		if res.Outcome == idem.Acquired && (res.Lease.Scope != r.scope || res.Lease.Key != key) {
			out.Owner = "" // a lease of another key: the model refuses it
		}
		return out, nil
	})
	if out.Unknown {
		return idem.Lease{}, false
	}
	r.count(func(s *StoreStats) {
		switch out.Outcome {
		case idem.Acquired:
			s.Acquired++
			if out.TookOver {
				s.TookOver++
			}
		case idem.Completed:
			s.Replayed++
		case idem.InFlight:
			s.InFlight++
		case idem.Mismatch:
			s.Mismatch++
		}
	})
	if out.Outcome != idem.Acquired {
		return idem.Lease{}, false
	}
	r.mu.Lock()
	r.leases = append(r.leases, got)
	r.mu.Unlock()
	return got, true
}

// complete reports whether the outcome was unknown.
func (r *storeRunner) complete(ctx context.Context, client int, in StoreIn) bool {
	l := idem.Lease{Scope: r.scope, Key: in.Key, Owner: in.Owner, Fence: in.Fence}
	out := r.call(ctx, client, in, func(ctx context.Context) (StoreOut, error) {
		return StoreOut{}, r.store.Complete(ctx, l, idem.Response{StatusCode: 200, Body: []byte(in.Body)}, time.Duration(in.Retention))
	})
	if !out.Unknown && out.Err == errNone {
		r.count(func(s *StoreStats) { s.Completed++ })
	}
	return out.Unknown
}

func (r *storeRunner) extend(ctx context.Context, client int, l idem.Lease, ttl time.Duration) (idem.Lease, bool) {
	in := StoreIn{Op: OpExtend, Key: l.Key, Owner: l.Owner, Fence: l.Fence, Lease: int64(ttl)}
	var got idem.Lease
	out := r.call(ctx, client, in, func(ctx context.Context) (StoreOut, error) {
		nl, err := r.store.Extend(ctx, l, ttl)
		got = nl
		// The lease returned must be the one extended (the model checks
		// its owner and fence): a caller may go on with it.
		out := StoreOut{Until: nl.Until.UnixNano(), Owner: nl.Owner, Fence: nl.Fence}
		if nl.Scope != l.Scope || nl.Key != l.Key {
			out.Owner = "" // nobody's lease
		}
		return out, err
	})
	return got, !out.Unknown && out.Err == errNone
}

func (r *storeRunner) release(ctx context.Context, client int, l idem.Lease) {
	in := StoreIn{Op: OpRelease, Key: l.Key, Owner: l.Owner, Fence: l.Fence}
	out := r.call(ctx, client, in, func(ctx context.Context) (StoreOut, error) {
		return StoreOut{}, r.store.Release(ctx, l)
	})
	if !out.Unknown && out.Err == errNone {
		r.count(func(s *StoreStats) { s.Released++ })
	}
}

func (r *storeRunner) get(ctx context.Context, client int, key string) {
	r.call(ctx, client, StoreIn{Op: OpGet, Key: key}, func(ctx context.Context) (StoreOut, error) {
		rec, err := r.store.Get(ctx, r.scope, key)
		if err != nil {
			return StoreOut{}, err
		}
		return StoreOut{Rec: viewOf(rec)}, nil
	})
}

func (r *storeRunner) sweep(ctx context.Context, client int) {
	var n int
	r.call(ctx, client, StoreIn{Op: OpSweep}, func(ctx context.Context) (StoreOut, error) {
		var err error
		n, err = r.store.Sweep(ctx, 0)
		return StoreOut{}, err
	})
	r.count(func(s *StoreStats) { s.Swept += n })
}
