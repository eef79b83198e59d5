package lincheck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/token"
)

// TokenOp names a call of token.Store.
type TokenOp uint8

// The calls the token model knows.
const (
	TokenInsert TokenOp = iota + 1
	TokenConsume
	TokenSweep
)

func (o TokenOp) String() string { return [...]string{"?", "Insert", "Consume", "Sweep"}[o] }

// TokenIn is a call to a token store.
type TokenIn struct {
	Op TokenOp
	window
	Digest string // empty for Sweep
	TTL    int64  // Insert
	Keep   int64  // Consume
	Result string // Consume: unique per call
	FP     string // Consume
}

// TokenOut is a token store's answer.
type TokenOut struct {
	Unknown bool
	// Insert: the expiry, or duplicate. Consume: nil, used (with the
	// first use's result and fingerprint) or invalid.
	Expires   int64
	Duplicate bool
	Used      bool
	Invalid   bool
	Result    string
	FP        string
}

// tokenState is the model's token of one digest.
type tokenState struct {
	Exists       bool
	Used         bool
	ExpLo, ExpHi int64
	Result, FP   string
}

// TokenModel is the sequential specification of token.Store for Insert,
// Consume and Sweep, one digest per partition: a token is spent once, a
// second use answers the first use's result until the token expires, an
// expired token is invalid. dropsExpired: the store forgets an expired
// token by itself (Redis), so that its digest may be inserted again.
func TokenModel(margin time.Duration, dropsExpired bool) porcupineModel {
	m := tokenModel{clock{int64(margin)}, dropsExpired}
	return nondeterministic(byKey(func(in any) string { return in.(TokenIn).Digest }),
		tokenState{}, m.step, m.describe, describeToken)
}

type tokenModel struct {
	clock
	dropsExpired bool
}

func (m tokenModel) step(s tokenState, in TokenIn, out TokenOut) []tokenState {
	w := in.window
	starts := []tokenState{s}
	if m.dropsExpired && s.Exists && m.mayHaveCome(s.ExpLo, w) {
		starts = append(starts, tokenState{})
	}
	var next []tokenState
	for _, s := range starts {
		if out.Unknown {
			next = append(next, s)
		}
		switch in.Op {
		case TokenInsert:
			n := tokenState{Exists: true, ExpLo: add(w.Call, in.TTL), ExpHi: add(w.Ret, in.TTL)}
			switch {
			case !s.Exists && out.Unknown:
				next = append(next, n)
			case !s.Exists && !out.Duplicate && m.within(out.Expires, n.ExpLo, n.ExpHi):
				n.ExpLo, n.ExpHi = out.Expires, out.Expires
				next = append(next, n)
			case s.Exists && !out.Unknown && out.Duplicate:
				next = append(next, s)
			}
		case TokenConsume:
			expired := s.Exists && m.mayHaveCome(s.ExpLo, w)
			live := s.Exists && m.mayBeAhead(s.ExpHi, w)
			spent := s
			spent.Used, spent.Result, spent.FP = true, in.Result, in.FP
			spent.ExpLo, spent.ExpHi = max(s.ExpLo, add(w.Call, in.Keep)), max(s.ExpHi, add(w.Ret, in.Keep))
			switch {
			case out.Unknown && live && !s.Used:
				next = append(next, spent)
			case out.Unknown:
			case !out.Used && !out.Invalid && live && !s.Used:
				next = append(next, spent)
			case out.Used && live && s.Used && out.Result == s.Result && out.FP == s.FP:
				next = append(next, s)
			case out.Invalid && (!s.Exists || expired):
				next = append(next, s)
			}
		case TokenSweep:
			if s.Exists && m.mayHaveCome(s.ExpLo, w) {
				next = append(next, tokenState{})
			}
			if !out.Unknown {
				next = append(next, s)
			}
		}
	}
	return next
}

func (m tokenModel) describe(in TokenIn, out TokenOut) string {
	res := "ok"
	switch {
	case out.Unknown:
		res = "unknown"
	case out.Duplicate:
		res = "duplicate"
	case out.Used:
		res = "used:" + out.Result
	case out.Invalid:
		res = "invalid"
	case in.Op == TokenInsert:
		res = "expires " + describeTime(out.Expires)
	}
	d := in.Digest
	if len(d) > 8 {
		d = d[:8]
	}
	return fmt.Sprintf("%s(%s %s) → %s", in.Op, d, in.Result, res)
}

func describeToken(s tokenState) string {
	if !s.Exists {
		return "none"
	}
	return fmt.Sprintf("{used=%v %s exp=[%s,%s]}", s.Used, s.Result, describeTime(s.ExpLo), describeTime(s.ExpHi))
}

// TokenWorkload is a random mix of token calls from several clients on a
// few digests at a time: inserts (some of a digest already stored),
// consumptions (most more than once), sweeps, with short TTLs and keeps.
type TokenWorkload struct {
	Clients, OpsPerClient int             // defaults 8, 300
	TTLs                  []time.Duration // default 10 ms, 50 ms, 250 ms
	Timeout, Think        time.Duration   // defaults 3 s, 4 ms
	Sweep                 bool
	// SplitResend records an ErrInvalid answer as two calls in its
	// window: a Consume that may have spent the token unseen, then the
	// refusal. It is for a store whose client sends a call again after
	// its reply was lost (go-redis): when the token expires between the
	// two runs, the second finds it gone (token.Spend.Keep, 24 h by
	// default, makes that window vanish in practice).
	SplitResend bool
	// MaxUnknown ends the run early once this many calls had an unknown
	// outcome (0: no limit); see StoreWorkload.MaxUnknown.
	MaxUnknown int
}

// RunTokens runs the workload against s and returns its history.
func RunTokens(ctx context.Context, s token.Store, w TokenWorkload) (*History, map[string]int) {
	w.Clients, w.OpsPerClient = cmp(w.Clients, 8), cmp(w.OpsPerClient, 300)
	if len(w.TTLs) == 0 {
		w.TTLs = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond}
	}
	w.Timeout, w.Think = cmp(w.Timeout, 3*time.Second), cmp(w.Think, 4*time.Millisecond)
	h := NewHistory()
	scope := "lin-" + fmt.Sprint(mrand.Uint64())
	var (
		mu      sync.Mutex
		digests []string
		counts  = map[string]int{}
	)
	var unknown atomic.Int64
	call := func(client int, in TokenIn, f func(ctx context.Context) (TokenOut, error)) TokenOut {
		ctx, cancel := context.WithTimeout(ctx, w.Timeout)
		defer cancel()
		in.Call = now()
		out, err := f(ctx)
		in.Ret = now()
		var used *token.UsedError
		switch {
		case err == nil:
		case errors.Is(err, token.ErrDuplicate):
			out = TokenOut{Duplicate: true}
		case errors.As(err, &used):
			out = TokenOut{Used: true, Result: string(used.Result), FP: used.Fingerprint}
		case errors.Is(err, token.ErrInvalid):
			out = TokenOut{Invalid: true}
		default:
			out = TokenOut{Unknown: true}
			in.Ret = Never
			unknown.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
		if w.SplitResend && out.Invalid {
			h.add(client, in, TokenOut{Unknown: true}, in.Call, in.Ret)
		}
		h.add(client, in, out, in.Call, in.Ret)
		mu.Lock()
		counts[in.Op.String()+" "+describeOut(out)]++
		mu.Unlock()
		return out
	}
	var wg sync.WaitGroup
	for c := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := mrand.New(mrand.NewPCG(mrand.Uint64(), uint64(c)))
			for n := range w.OpsPerClient {
				if w.MaxUnknown > 0 && unknown.Load() >= int64(w.MaxUnknown) {
					return
				}
				time.Sleep(time.Duration(rnd.Int64N(int64(w.Think))))
				mu.Lock()
				var d string
				if len(digests) > 0 {
					d = digests[max(0, len(digests)-1-rnd.IntN(6))] // one of the newest
				}
				mu.Unlock()
				p := rnd.Float64()
				switch {
				case d != "" && p < 0.6:
					fp := "a"
					if rnd.IntN(5) == 0 {
						fp = "b"
					}
					in := TokenIn{Op: TokenConsume, Digest: d, Keep: int64(w.TTLs[rnd.IntN(len(w.TTLs))]),
						Result: fmt.Sprintf("c%d-%d", c, n), FP: fp}
					call(c, in, func(ctx context.Context) (TokenOut, error) {
						return TokenOut{}, s.Consume(ctx, scope, d, token.Spend{Fingerprint: fp, Result: []byte(in.Result), Keep: time.Duration(in.Keep)})
					})
				case p < 0.63 && w.Sweep:
					call(c, TokenIn{Op: TokenSweep}, func(ctx context.Context) (TokenOut, error) {
						_, err := s.Sweep(ctx, 1000)
						return TokenOut{}, err
					})
				default:
					if d == "" || rnd.IntN(4) != 0 { // a new digest, or one already stored
						sum := sha256.Sum256(fmt.Appendf(nil, "%s-%d-%d-%d", scope, c, n, rnd.Uint64()))
						d = hex.EncodeToString(sum[:])
					}
					ttl := w.TTLs[rnd.IntN(len(w.TTLs))]
					out := call(c, TokenIn{Op: TokenInsert, Digest: d, TTL: int64(ttl)}, func(ctx context.Context) (TokenOut, error) {
						exp, err := s.Insert(ctx, scope, d, ttl)
						return TokenOut{Expires: exp.UnixNano()}, err
					})
					if !out.Unknown && !out.Duplicate {
						mu.Lock()
						digests = append(digests, d)
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	return h, counts
}

func describeOut(out TokenOut) string {
	switch {
	case out.Unknown:
		return "unknown"
	case out.Duplicate:
		return "duplicate"
	case out.Used:
		return "used"
	case out.Invalid:
		return "invalid"
	}
	return "ok"
}
