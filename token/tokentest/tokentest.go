// Package tokentest is the conformance suite of token.Store: every store
// runs it against a real server. Run calls the store directly, with
// digests of fresh IDs, and checks what each operation answers and what it
// leaves behind (a token spent by a call that answered an error would show
// in the next Consume).
package tokentest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/token"
)

// Caps says what a store offers beyond token.Store, and how it expires.
type Caps struct {
	// BeginTx, when set, enables the ConsumeTx cases; it begins a
	// transaction on the database the store writes to. The store must then
	// implement token.TxStore.
	BeginTx func(ctx context.Context) (*sql.Tx, error)
	// ExpiresByItself says that the store deletes expired tokens on its
	// own (Redis key TTLs), so Sweep removes none and returns 0. Otherwise
	// Sweep must remove exactly the expired tokens, up to its limit: Run's
	// sweeping case then needs a store that no one else sweeps or fills
	// with expiring tokens while it runs (a database of its own).
	ExpiresByItself bool
	// Precision is the store clock's granularity; zero means 1 ms.
	Precision time.Duration
}

// Run runs the conformance suite against the stores newStore returns. It
// calls newStore once per case; newStore may return the same store every
// time. Run returns when every case has finished.
func Run(t *testing.T, newStore func(t *testing.T) token.Store, caps Caps) {
	t.Helper()
	if newStore == nil {
		t.Fatal("tokentest.Run: newStore is nil")
	}
	if caps.Precision <= 0 {
		caps.Precision = time.Millisecond
	}
	// Sweep removes the expired tokens of every scope, which other cases
	// are about to look at: the sweeping case runs first, alone.
	t.Run("serial", func(t *testing.T) {
		for _, c := range cases {
			if c.serial {
				t.Run(c.name, func(t *testing.T) { c.exec(t, newStore, caps) })
			}
		}
	})
	t.Run("parallel", func(t *testing.T) {
		for _, c := range cases {
			if !c.serial {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.exec(t, newStore, caps)
				})
			}
		}
	})
}

type testCase struct {
	name   string
	serial bool // calls Sweep
	tx     bool // needs Caps.BeginTx and a token.TxStore
	tokens bool // runs token.Tokens over the store
	run    func(h *harness)
}

func (c testCase) exec(t *testing.T, newStore func(t *testing.T) token.Store, caps Caps) {
	if c.tx && caps.BeginTx == nil {
		t.Skip("Caps.BeginTx is nil: the store does not consume inside a caller's transaction")
	}
	s := newStore(t)
	if s == nil {
		t.Fatal("newStore returned nil")
	}
	if c.tx {
		if _, ok := s.(token.TxStore); !ok {
			t.Fatalf("Caps.BeginTx is set but %T does not implement token.TxStore", s)
		}
	}
	c.run(&harness{T: t, ctx: t.Context(), store: s, caps: caps, scope: "tokentest:" + c.name + ":" + strings.ToLower(rand.Text()[:12])})
}

// Durations the cases use.
const (
	longTTL  = time.Hour
	shortTTL = 300 * time.Millisecond
	// skew bounds the difference between the store's clock and the test's.
	skew = 2 * time.Second
)

type harness struct {
	*testing.T
	ctx   context.Context
	store token.Store
	caps  Caps
	scope string
}

// newDigest returns the digest of a fresh, well-formed ID.
func newDigest(t testing.TB) string {
	t.Helper()
	var b [16]byte
	_, _ = rand.Read(b[:])
	d, err := token.Digest(base64.RawURLEncoding.EncodeToString(b[:]))
	if err != nil {
		t.Fatalf("Digest: %v", err)
	}
	return d
}

// insert stores a new token of the case's scope and returns its digest.
func (h *harness) insert(ttl time.Duration) string {
	h.Helper()
	return h.insertAs(h.scope, ttl)
}

func (h *harness) insertAs(scope string, ttl time.Duration) string {
	h.Helper()
	d := newDigest(h)
	before := time.Now()
	exp, err := h.store.Insert(h.ctx, scope, d, ttl)
	if err != nil {
		h.Fatalf("Insert(%q, %s, %v): %v", scope, d, ttl, err)
	}
	if lo, hi := before.Add(ttl-skew), time.Now().Add(ttl+skew); exp.Before(lo) || exp.After(hi) {
		h.Fatalf("Insert(ttl %v) expires at %v, want the store's now + ttl, within [%v, %v]", ttl, exp, lo, hi)
	}
	return d
}

func (h *harness) consume(scope, d string, result []byte) error {
	h.Helper()
	return h.store.Consume(h.ctx, scope, d, token.Spend{Result: result})
}

// first fails the case unless Consume spends the token.
func (h *harness) first(scope, d string, result []byte) {
	h.Helper()
	if err := h.consume(scope, d, result); err != nil {
		h.Fatalf("first Consume(%q, %s) = %v, want nil", scope, d, err)
	}
}

// used fails the case unless Consume answers a *UsedError with result, and
// returns it.
func (h *harness) used(scope, d string, want []byte) *token.UsedError {
	h.Helper()
	err := h.consume(scope, d, []byte("a later use's result"))
	var ue *token.UsedError
	if !errors.As(err, &ue) || !errors.Is(err, token.ErrUsed) {
		h.Fatalf("Consume(%q, %s) of a used token = %v, want a *token.UsedError", scope, d, err)
	}
	if !bytes.Equal(ue.Result, want) || (want == nil) != (ue.Result == nil) {
		h.Fatalf("UsedError.Result = %s, want %s", show(ue.Result), show(want))
	}
	if ue.UsedAt.IsZero() {
		h.Fatal("UsedError.UsedAt is zero")
	}
	return ue
}

// invalid fails the case unless Consume answers token.ErrInvalid.
func (h *harness) invalid(scope, d string, why string) {
	h.Helper()
	err := h.consume(scope, d, []byte("must not stick"))
	if !errors.Is(err, token.ErrInvalid) || errors.Is(err, token.ErrUsed) {
		h.Fatalf("Consume(%q, %s) of %s = %v, want token.ErrInvalid", scope, d, why, err)
	}
}

// raceInsert runs n concurrent Inserts of digest d, the i-th under
// scope(i), and returns their errors and how many succeeded; it fails the
// case on an error other than token.ErrDuplicate.
func (h *harness) raceInsert(n int, d string, scope func(int) string) ([]error, int) {
	h.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = h.store.Insert(h.ctx, scope(i), d, longTTL)
		})
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, token.ErrDuplicate):
			h.Fatalf("goroutine %d: Insert = %v, want nil or token.ErrDuplicate", i, err)
		}
	}
	return errs, won
}

// tokens returns token.Tokens over the case's store (cfg nil: defaults).
func (h *harness) tokens(cfg *token.Config) *token.Tokens {
	h.Helper()
	toks, err := token.New(h.store, cfg)
	if err != nil {
		h.Fatalf("token.New: %v", err)
	}
	return toks
}

func (h *harness) issue(toks *token.Tokens) token.Token {
	h.Helper()
	tok, err := toks.Issue(h.ctx, h.scope)
	if err != nil {
		h.Fatalf("Issue: %v", err)
	}
	return tok
}

// probes stores tokens of ttl, under a scope of their own, to tell when
// the store's clock has passed the expiry of the tokens inserted before
// them: see waitExpired.
func (h *harness) probes(ttl time.Duration) []probe {
	h.Helper()
	p := make([]probe, 40)
	for i := range p {
		p[i] = probe{h.scope + ":probe", h.insertAs(h.scope+":probe", ttl)}
	}
	return p
}

type probe struct{ scope, digest string }

// waitExpired waits until the store says the probes have expired, and so
// every token inserted before them with their TTL: it spends a probe now
// and then (a live one answers nil) until one answers ErrInvalid. It
// fails the case if the probes run out.
func (h *harness) waitExpired(probes []probe) {
	h.Helper()
	for _, p := range probes {
		err := h.store.Consume(h.ctx, p.scope, p.digest, token.Spend{})
		if errors.Is(err, token.ErrInvalid) {
			return
		}
		if err != nil {
			h.Fatalf("Consume of a probe: %v", err)
		}
		time.Sleep(shortTTL/10 + h.caps.Precision)
	}
	h.Fatalf("%d probes of TTL %v spent and none expired: is the store's clock running?", len(probes), shortTTL)
}

func (h *harness) sleepPast(ttl time.Duration) {
	time.Sleep(ttl + 100*time.Millisecond + 2*h.caps.Precision)
}

func show(b []byte) string {
	if b == nil {
		return "nil"
	}
	if len(b) > 40 {
		return fmt.Sprintf("%d bytes %q…", len(b), b[:40])
	}
	return fmt.Sprintf("%q", b)
}

var cases = []testCase{
	{name: "FirstUseThenUsed", run: func(h *harness) {
		d := h.insert(longTTL)
		before := time.Now()
		h.first(h.scope, d, []byte("order-1"))
		ue := h.used(h.scope, d, []byte("order-1"))
		if lo, hi := before.Add(-skew), time.Now().Add(skew); ue.UsedAt.Before(lo) || ue.UsedAt.After(hi) {
			h.Fatalf("UsedAt = %v, want the store's now at the first use, within [%v, %v]", ue.UsedAt, lo, hi)
		}
		// Every later use answers the same: the first use's time and result.
		again := h.used(h.scope, d, []byte("order-1"))
		if !again.UsedAt.Equal(ue.UsedAt) {
			h.Fatalf("UsedAt moved from %v to %v on a later Consume", ue.UsedAt, again.UsedAt)
		}
	}},

	{name: "NilAndEmptyResult", run: func(h *harness) {
		d := h.insert(longTTL)
		h.first(h.scope, d, nil)
		h.used(h.scope, d, nil)
		e := h.insert(longTTL)
		h.first(h.scope, e, []byte{})
		h.used(h.scope, e, nil)
	}},

	{name: "BinaryResults", run: func(h *harness) {
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		big := bytes.Repeat([]byte{0, 0xff, 'x', '\n'}, token.MaxResultLen/4)
		for _, r := range [][]byte{all, big, []byte("\x00"), []byte("ünïcode ✓"), []byte("   ")} {
			d := h.insert(longTTL)
			given := slices.Clone(r)
			h.first(h.scope, d, given)
			// The store keeps its own copy.
			for i := range given {
				given[i] = '?'
			}
			h.used(h.scope, d, r)
		}
	}},

	{name: "Unknown", run: func(h *harness) {
		h.invalid(h.scope, newDigest(h), "a token never issued")
		// It stays unknown: the failed Consume stored nothing.
		d := newDigest(h)
		h.invalid(h.scope, d, "a token never issued")
		h.invalid(h.scope, d, "a token never issued, presented twice")
	}},

	{name: "OtherScope", run: func(h *harness) {
		d := h.insert(longTTL)
		other := h.scope + ":other"
		h.invalid(other, d, "another scope's unused token")
		// The other scope did not spend it.
		h.first(h.scope, d, []byte("mine"))
		// Nor does it learn that it is used, or its result.
		h.invalid(other, d, "another scope's used token")
		h.used(h.scope, d, []byte("mine"))
	}},

	{name: "ScopesAreBytes", run: func(h *harness) {
		// Scopes are compared byte for byte: no case folding, no trailing
		// space padding, no Unicode normalisation.
		base := h.scope + "-ä"
		for _, other := range []string{base + " ", strings.ToUpper(base), h.scope + "-a\u0308", base[:len(base)-2]} {
			d := h.insertAs(base, longTTL)
			h.invalid(other, d, fmt.Sprintf("the token of scope %q under %q", base, other))
			h.first(base, d, nil)
		}
		// Hostile scopes are scopes like any other.
		for _, s := range []string{"{}", " ", "a:b:{c}", "😀", strings.Repeat("s", token.MaxScopeLen), "'; DROP TABLE idem_tokens; --", `\x00`} {
			d := h.insertAs(s, longTTL)
			h.first(s, d, []byte(s))
			h.used(s, d, []byte(s))
		}
	}},

	{name: "Duplicate", run: func(h *harness) {
		d := h.insert(longTTL)
		if _, err := h.store.Insert(h.ctx, h.scope, d, longTTL); !errors.Is(err, token.ErrDuplicate) {
			h.Fatalf("Insert of a stored digest under its scope = %v, want token.ErrDuplicate", err)
		}
		// Under another scope, the store may refuse the digest (SQL) or
		// keep a token of its own (Redis): either way the two stay apart.
		other := h.scope + ":other"
		_, err := h.store.Insert(h.ctx, other, d, longTTL)
		switch {
		case errors.Is(err, token.ErrDuplicate):
			h.invalid(other, d, "a token whose duplicate Insert failed")
		case err == nil:
			h.first(other, d, []byte("other's"))
			h.used(other, d, []byte("other's"))
		default:
			h.Fatalf("Insert of a stored digest under another scope = %v, want nil or token.ErrDuplicate", err)
		}
		// The token is still the first Insert's, unused.
		h.first(h.scope, d, []byte("r"))
		// A second Insert does not make a used token new again.
		if _, err := h.store.Insert(h.ctx, h.scope, d, longTTL); !errors.Is(err, token.ErrDuplicate) {
			h.Fatalf("Insert of a used digest = %v, want token.ErrDuplicate", err)
		}
		h.used(h.scope, d, []byte("r"))
	}},

	{name: "Expiry", run: func(h *harness) {
		unused := h.insert(shortTTL)
		spent := h.insert(shortTTL)
		live := h.insert(longTTL)
		h.first(h.scope, spent, []byte("r"))
		h.used(h.scope, spent, []byte("r")) // remembered while the TTL runs
		h.sleepPast(shortTTL)
		h.invalid(h.scope, unused, "an expired unused token")
		h.invalid(h.scope, spent, "an expired used token")
		h.first(h.scope, live, nil)
	}},

	{name: "UsedKeepsTTL", run: func(h *harness) {
		// Consume does not extend the token's life.
		ttl := 2 * time.Second
		d := h.insert(ttl)
		h.first(h.scope, d, []byte("r"))
		time.Sleep(ttl / 2)
		h.used(h.scope, d, []byte("r"))
		h.sleepPast(ttl / 2)
		h.invalid(h.scope, d, "a used token past its TTL")
	}},

	{name: "CanceledContext", run: func(h *harness) {
		d := h.insert(longTTL)
		ctx, cancel := context.WithCancel(h.ctx)
		cancel()
		if err := h.store.Consume(ctx, h.scope, d, token.Spend{Result: []byte("x")}); !errors.Is(err, context.Canceled) {
			h.Fatalf("Consume with a cancelled context = %v, want context.Canceled", err)
		}
		if _, err := h.store.Insert(ctx, h.scope, newDigest(h), longTTL); !errors.Is(err, context.Canceled) {
			h.Fatalf("Insert with a cancelled context = %v, want context.Canceled", err)
		}
		h.first(h.scope, d, []byte("y"))
		h.used(h.scope, d, []byte("y"))
	}},

	{name: "RaceConsume", run: func(h *harness) {
		const n = 100
		d := h.insert(longTTL)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = h.store.Consume(h.ctx, h.scope, d, token.Spend{Result: fmt.Appendf(nil, "result-%d", i)})
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				if winner >= 0 {
					h.Fatalf("goroutines %d and %d both spent the token", winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			h.Fatalf("no goroutine spent the token: %v", errors.Join(errs...))
		}
		want := fmt.Appendf(nil, "result-%d", winner)
		for i, err := range errs {
			if i == winner {
				continue
			}
			var ue *token.UsedError
			if !errors.As(err, &ue) {
				h.Fatalf("goroutine %d: %v, want a *token.UsedError", i, err)
			}
			if !bytes.Equal(ue.Result, want) {
				h.Fatalf("goroutine %d: UsedError.Result = %s, want the winner's %q", i, show(ue.Result), want)
			}
		}
		h.used(h.scope, d, want)
	}},

	{name: "RaceInsert", run: func(h *harness) {
		// n inserts of one digest under one scope: one wins.
		const n = 20
		d := newDigest(h)
		_, won := h.raceInsert(n, d, func(int) string { return h.scope })
		if won != 1 {
			h.Fatalf("%d goroutines inserted the digest, want 1", won)
		}
		h.first(h.scope, d, []byte("r"))
		h.used(h.scope, d, []byte("r"))
	}},

	{name: "RaceInsertScopes", run: func(h *harness) {
		// n inserts of one digest under n scopes: a store that refuses a
		// digest of another scope lets one win; one that keeps tokens
		// per scope lets all win, each its own token.
		const n = 20
		d := newDigest(h)
		errs, won := h.raceInsert(n, d, func(i int) string { return fmt.Sprintf("%s:%d", h.scope, i) })
		if won != 1 && won != n {
			h.Fatalf("%d of %d goroutines inserted the digest, want 1 or all", won, n)
		}
		for i, err := range errs {
			scope := fmt.Sprintf("%s:%d", h.scope, i)
			if err != nil {
				h.invalid(scope, d, "a token whose Insert lost the race")
				continue
			}
			r := []byte(scope)
			h.first(scope, d, r)
			h.used(scope, d, r)
		}
	}},

	{name: "Sweep", serial: true, run: func(h *harness) {
		var expiring []string
		for range 5 {
			expiring = append(expiring, h.insert(shortTTL))
		}
		h.first(h.scope, expiring[0], []byte("used, then expired"))
		liveUnused := h.insert(longTTL)
		liveUsed := h.insert(longTTL)
		h.first(h.scope, liveUsed, []byte("kept"))
		h.sleepPast(shortTTL)

		if h.caps.ExpiresByItself {
			n, err := h.store.Sweep(h.ctx, 100)
			if err != nil || n != 0 {
				h.Fatalf("Sweep of a store that expires by itself = %d, %v; want 0, nil", n, err)
			}
		} else {
			for i, want := range []int{2, 2, 1, 0} {
				n, err := h.store.Sweep(h.ctx, 2)
				if err != nil {
					h.Fatalf("Sweep(2) #%d: %v", i+1, err)
				}
				if n != want {
					h.Fatalf("Sweep(2) #%d removed %d, want %d (5 tokens expired; the store must be this case's alone)", i+1, n, want)
				}
			}
		}
		for _, d := range expiring {
			h.invalid(h.scope, d, "an expired token after Sweep")
		}
		// Sweep leaves live tokens, used or not, as they were.
		h.used(h.scope, liveUsed, []byte("kept"))
		h.first(h.scope, liveUnused, nil)
	}},

	{name: "KeepAfterUse", run: func(h *harness) {
		// A used token is kept Spend.Keep after its use, past its TTL;
		// an unused one of the same TTL dies at its TTL.
		unused := h.insert(shortTTL)
		spent := h.insert(shortTTL)
		if err := h.store.Consume(h.ctx, h.scope, spent, token.Spend{Result: []byte("order-9"), Keep: longTTL}); err != nil {
			h.Fatalf("first Consume with Keep: %v", err)
		}
		h.waitExpired(h.probes(shortTTL))
		h.invalid(h.scope, unused, "an unused token past its TTL")
		h.used(h.scope, spent, []byte("order-9"))
		// The Keep of a later Consume changes nothing.
		h.used(h.scope, spent, []byte("order-9"))
	}},

	{name: "KeepEnds", run: func(h *harness) {
		// Keep extends the expiry to the use + Keep, not for ever; a Keep
		// shorter than the TTL leaves the expiry as it was.
		ttl, keep := 2*time.Second, 4*time.Second
		d := h.insert(ttl)
		if err := h.store.Consume(h.ctx, h.scope, d, token.Spend{Result: []byte("r"), Keep: keep}); err != nil {
			h.Fatalf("first Consume with Keep: %v", err)
		}
		deadline := time.Now().Add(keep + skew + 5*time.Second)
		for {
			err := h.consume(h.scope, d, nil)
			if errors.Is(err, token.ErrInvalid) {
				break
			}
			var ue *token.UsedError
			if !errors.As(err, &ue) || string(ue.Result) != "r" {
				h.Fatalf("Consume of a used token before its keep ended = %v, want a *token.UsedError with %q", err, "r")
			}
			if time.Now().After(deadline) {
				h.Fatalf("a token used with Keep %v still answers ErrUsed after %v", keep, keep+skew+5*time.Second)
			}
			time.Sleep(50 * time.Millisecond)
		}
		long := h.insert(longTTL)
		if err := h.store.Consume(h.ctx, h.scope, long, token.Spend{Result: []byte("r"), Keep: time.Millisecond}); err != nil {
			h.Fatalf("first Consume with a short Keep: %v", err)
		}
		h.sleepPast(time.Millisecond)
		h.used(h.scope, long, []byte("r")) // its TTL, an hour, still runs
	}},

	{name: "Fingerprint", run: func(h *harness) {
		// The store keeps the fingerprint of the first use and returns
		// it; it compares nothing itself.
		fp := token.Fingerprint([]byte("sku=A&quantity=1"))
		d := h.insert(longTTL)
		if err := h.store.Consume(h.ctx, h.scope, d, token.Spend{Fingerprint: fp, Result: []byte("order-1"), Keep: time.Minute}); err != nil {
			h.Fatalf("first Consume: %v", err)
		}
		other := token.Fingerprint([]byte("other"))
		var ue *token.UsedError
		if err := h.store.Consume(h.ctx, h.scope, d, token.Spend{Fingerprint: other}); !errors.As(err, &ue) || ue.Fingerprint != fp || string(ue.Result) != "order-1" {
			h.Fatalf("Consume of a token used with a fingerprint = %v (%+v), want a *token.UsedError with fingerprint %s and result order-1", err, ue, fp)
		}
		e := h.insert(longTTL)
		h.first(h.scope, e, []byte("none"))
		if err := h.store.Consume(h.ctx, h.scope, e, token.Spend{Fingerprint: fp}); !errors.As(err, &ue) || ue.Fingerprint != "" {
			h.Fatalf("Consume of a token used without a fingerprint = %v (%+v), want a *token.UsedError without one", err, ue)
		}
	}},

	{name: "Mismatch", tokens: true, run: func(h *harness) {
		toks := h.tokens(nil)
		a, b := []byte("sku=A&quantity=1"), []byte("sku=A&quantity=2")
		tok := h.issue(toks)
		if err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Request: a, Result: []byte("order-1")}); err != nil {
			h.Fatalf("first Consume: %v", err)
		}
		var me *token.MismatchError
		err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Request: b, Result: []byte("order-2")})
		if !errors.As(err, &me) || !errors.Is(err, token.ErrMismatch) || errors.Is(err, token.ErrUsed) || me.UsedAt.IsZero() {
			h.Fatalf("Consume with a different request = %v, want a *token.MismatchError that is not ErrUsed", err)
		}
		// The same request, or none, is led to the first use's result.
		for _, req := range [][]byte{a, nil} {
			var ue *token.UsedError
			if err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Request: req}); !errors.As(err, &ue) || string(ue.Result) != "order-1" {
				h.Fatalf("Consume with request %q = %v, want a *token.UsedError with order-1", req, err)
			}
		}
		// A token first used without a request is not checked.
		tok = h.issue(toks)
		if err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Result: []byte("order-3")}); err != nil {
			h.Fatalf("first Consume without request: %v", err)
		}
		var ue *token.UsedError
		if err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Request: b}); !errors.As(err, &ue) || string(ue.Result) != "order-3" {
			h.Fatalf("Consume with a request of a token used without one = %v, want a *token.UsedError with order-3", err)
		}
	}},

	{name: "MismatchTx", tx: true, tokens: true, run: func(h *harness) {
		toks := h.tokens(nil)
		tok := h.issue(toks)
		tx := h.beginTx()
		if err := toks.ConsumeTx(h.ctx, tx, h.scope, tok.ID, token.Use{Request: []byte("a"), Result: []byte("order-1")}); err != nil {
			h.Fatalf("ConsumeTx: %v", err)
		}
		h.endTx(tx, true)
		tx = h.beginTx()
		if err := toks.ConsumeTx(h.ctx, tx, h.scope, tok.ID, token.Use{Request: []byte("b")}); !errors.Is(err, token.ErrMismatch) {
			h.Fatalf("ConsumeTx with a different request = %v, want token.ErrMismatch", err)
		}
		h.endTx(tx, false)
		var ue *token.UsedError
		if err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Request: []byte("a")}); !errors.As(err, &ue) || string(ue.Result) != "order-1" {
			h.Fatalf("Consume with the first request = %v, want a *token.UsedError with order-1", err)
		}
	}},

	{name: "RaceMismatch", tokens: true, run: func(h *harness) {
		// n different submissions under one token: one spends it, the
		// others are told it was used for another request.
		const n = 50
		toks := h.tokens(nil)
		tok := h.issue(toks)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				errs[i] = toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Request: fmt.Appendf(nil, "request-%d", i), Result: fmt.Appendf(nil, "order-%d", i)})
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				h.Fatalf("goroutines %d and %d both spent the token", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, token.ErrMismatch):
				h.Fatalf("goroutine %d: %v, want nil or a *token.MismatchError", i, err)
			}
		}
		if winner < 0 {
			h.Fatal("no goroutine spent the token")
		}
		var ue *token.UsedError
		if err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Request: fmt.Appendf(nil, "request-%d", winner)}); !errors.As(err, &ue) || string(ue.Result) != fmt.Sprintf("order-%d", winner) {
			h.Fatalf("the winner's request again = %v, want a *token.UsedError with its order", err)
		}
	}},

	{name: "Trim", run: func(h *harness) {
		// 30 tokens, each expiring after the one before; the 3 used
		// ones among the 10 oldest are neither counted nor removed.
		other := h.scope + ":other"
		others := []string{h.insertAs(other, longTTL), h.insertAs(other, longTTL)}
		var ds []string
		for i := range 30 {
			ds = append(ds, h.insert(longTTL+time.Duration(i)*time.Second))
		}
		for _, i := range []int{0, 4, 9} {
			h.first(h.scope, ds[i], fmt.Appendf(nil, "used-%d", i))
		}
		n, err := h.store.Trim(h.ctx, h.scope, 20)
		if err != nil || n != 7 {
			h.Fatalf("Trim(20) of 27 unused tokens = %d, %v; want 7, nil", n, err)
		}
		if n, err := h.store.Trim(h.ctx, h.scope, 20); err != nil || n != 0 {
			h.Fatalf("Trim(20) again = %d, %v; want 0, nil", n, err)
		}
		for i, d := range ds {
			switch {
			case i == 0 || i == 4 || i == 9:
				h.used(h.scope, d, fmt.Appendf(nil, "used-%d", i))
			case i < 10:
				h.invalid(h.scope, d, fmt.Sprintf("token %d of 30, trimmed", i))
			}
		}
		// Trim(0) removes every unused token, never a used one.
		keep := h.insert(longTTL)
		h.first(h.scope, keep, []byte("kept"))
		if n, err := h.store.Trim(h.ctx, h.scope, 0); err != nil || n != 20 {
			h.Fatalf("Trim(0) of 20 unused tokens = %d, %v; want 20, nil", n, err)
		}
		for _, d := range ds[10:] {
			h.invalid(h.scope, d, "a token trimmed by Trim(0)")
		}
		h.used(h.scope, keep, []byte("kept"))
		for _, i := range []int{0, 4, 9} {
			h.used(h.scope, ds[i], fmt.Appendf(nil, "used-%d", i))
		}
		// Other scopes are untouched.
		for _, d := range others {
			h.first(other, d, nil)
		}
		if n, err := h.store.Trim(h.ctx, h.scope+":nobody", 0); err != nil || n != 0 {
			h.Fatalf("Trim of a scope without tokens = %d, %v; want 0, nil", n, err)
		}
	}},

	{name: "TrimNewest", run: func(h *harness) {
		// The newest live ones stay, whatever order they came in; the
		// newest is the token the caller just got.
		var ds []string
		for i := range 5 {
			ds = append(ds, h.insert(longTTL+time.Duration(5-i)*time.Second)) // the first expires last
		}
		if n, err := h.store.Trim(h.ctx, h.scope, 2); err != nil || n != 3 {
			h.Fatalf("Trim(2) of 5 = %d, %v; want 3, nil", n, err)
		}
		h.first(h.scope, ds[0], nil)
		h.first(h.scope, ds[1], nil)
		for _, d := range ds[2:] {
			h.invalid(h.scope, d, "a trimmed token")
		}
	}},

	{name: "TrimExpired", run: func(h *harness) {
		// Expired unused tokens do not count among the newest.
		expired := h.insert(shortTTL)
		live := h.insert(longTTL)
		h.waitExpired(h.probes(shortTTL))
		n, err := h.store.Trim(h.ctx, h.scope, 1)
		if err != nil || n > 1 {
			h.Fatalf("Trim(1) = %d, %v; want at most the expired token, nil", n, err)
		}
		h.invalid(h.scope, expired, "an expired token")
		h.first(h.scope, live, nil)
	}},

	{name: "RaceIssueTrim", tokens: true, run: func(h *harness) {
		// Concurrent issues under one scope, each trimming after its
		// insert, while some tokens are spent: the MaxLive newest unused
		// ones remain, the rest are gone, and no used one is removed.
		const n, maxLive = 60, 20
		toks := h.tokens(&token.Config{MaxLive: maxLive})
		type issued struct {
			tok    token.Token
			digest string
			used   bool
		}
		got := make([]issued, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				tok, err := toks.Issue(h.ctx, h.scope)
				if err != nil {
					h.Errorf("Issue %d: %v", i, err)
					return
				}
				d, _ := token.Digest(tok.ID)
				got[i] = issued{tok: tok, digest: d}
				if i%5 == 0 {
					err := toks.Consume(h.ctx, h.scope, tok.ID, token.Use{Result: fmt.Appendf(nil, "r-%d", i)})
					// Spent right away, unless a concurrent trim was first.
					got[i].used = err == nil
					if err != nil && !errors.Is(err, token.ErrInvalid) {
						h.Errorf("Consume %d: %v", i, err)
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if h.Failed() {
			return
		}
		var unused []issued
		for i, g := range got {
			if g.used {
				h.used(h.scope, g.digest, fmt.Appendf(nil, "r-%d", i))
			} else if i%5 != 0 {
				unused = append(unused, g)
			}
		}
		slices.SortFunc(unused, func(a, b issued) int { // newest first
			if c := b.tok.ExpiresAt.Compare(a.tok.ExpiresAt); c != 0 {
				return c
			}
			return strings.Compare(b.digest, a.digest)
		})
		// A trim counts the tokens spent after it as unused: the newest
		// maxLive - n/5 of the never spent ones are live for sure.
		sure := maxLive - n/5
		live := 0
		for i, g := range unused {
			err := h.consume(h.scope, g.digest, nil)
			switch {
			case err == nil:
				live++
			case errors.Is(err, token.ErrInvalid):
				if i < sure {
					h.Errorf("unused token %d by age, among the %d newest, was trimmed", i, sure)
				}
			default:
				h.Fatalf("Consume: %v", err)
			}
		}
		if live > maxLive || live < sure {
			h.Fatalf("%d unused tokens live after the issues, want %d to %d", live, sure, maxLive)
		}
	}},

	{name: "ConsumeTxCommit", tx: true, run: func(h *harness) {
		d := h.insert(longTTL)
		tx := h.beginTx()
		if err := h.consumeTx(tx, h.scope, d, []byte("order-7")); err != nil {
			h.Fatalf("ConsumeTx: %v", err)
		}
		// Inside the transaction the token is spent already.
		var ue *token.UsedError
		if err := h.consumeTx(tx, h.scope, d, []byte("again")); !errors.As(err, &ue) || string(ue.Result) != "order-7" {
			h.Fatalf("second ConsumeTx in the same transaction = %v, want a *token.UsedError with %q", err, "order-7")
		}
		h.endTx(tx, true)
		h.used(h.scope, d, []byte("order-7"))
	}},

	{name: "ConsumeTxRollback", tx: true, run: func(h *harness) {
		d := h.insert(longTTL)
		tx := h.beginTx()
		if err := h.consumeTx(tx, h.scope, d, []byte("rolled back")); err != nil {
			h.Fatalf("ConsumeTx: %v", err)
		}
		h.endTx(tx, false)
		h.first(h.scope, d, []byte("after the rollback"))
		h.used(h.scope, d, []byte("after the rollback"))
	}},

	{name: "ConsumeTxAnswers", tx: true, run: func(h *harness) {
		// The token is stored before the transaction begins: on SQLite, a
		// write outside an open transaction waits for it.
		d := h.insert(longTTL)
		tx := h.beginTx()
		if err := h.consumeTx(tx, h.scope, newDigest(h), nil); !errors.Is(err, token.ErrInvalid) {
			h.Fatalf("ConsumeTx of an unknown token = %v, want token.ErrInvalid", err)
		}
		if err := h.consumeTx(tx, h.scope+":other", d, nil); !errors.Is(err, token.ErrInvalid) {
			h.Fatalf("ConsumeTx under another scope = %v, want token.ErrInvalid", err)
		}
		h.endTx(tx, true)
		h.first(h.scope, d, []byte("r"))
		tx = h.beginTx()
		var ue *token.UsedError
		if err := h.consumeTx(tx, h.scope, d, nil); !errors.As(err, &ue) || string(ue.Result) != "r" {
			h.Fatalf("ConsumeTx of a used token = %v, want a *token.UsedError with %q", err, "r")
		}
		h.endTx(tx, true)
	}},

	{name: "ConsumeTxWaits", tx: true, run: func(h *harness) {
		for _, commit := range []bool{true, false} {
			d := h.insert(longTTL)
			tx := h.beginTx()
			if err := h.consumeTx(tx, h.scope, d, []byte("in tx")); err != nil {
				h.Fatalf("ConsumeTx: %v", err)
			}
			done := make(chan error, 1)
			go func() { done <- h.store.Consume(h.ctx, h.scope, d, token.Spend{Result: []byte("outside")}) }()
			select {
			case err := <-done:
				h.Fatalf("a Consume concurrent with an open ConsumeTx returned %v before the transaction ended", err)
			case <-time.After(200 * time.Millisecond):
			}
			h.endTx(tx, commit)
			err := <-done
			if commit {
				var ue *token.UsedError
				if !errors.As(err, &ue) || string(ue.Result) != "in tx" {
					h.Fatalf("Consume that waited for a committed ConsumeTx = %v, want a *token.UsedError with %q", err, "in tx")
				}
			} else {
				if err != nil {
					h.Fatalf("Consume that waited for a rolled back ConsumeTx = %v, want nil", err)
				}
				h.used(h.scope, d, []byte("outside"))
			}
		}
	}},

	{name: "ConsumeTxTrim", tx: true, run: func(h *harness) {
		// A Trim that meets a token a transaction is spending (an order
		// being placed) leaves it if the transaction commits: the
		// committed use keeps its row, and a repeat of the submission is
		// led to its result. If the transaction rolls back, the token is
		// unused again, and the trim may take it.
		for _, commit := range []bool{true, false} {
			d := h.insert(longTTL)
			newer := h.insert(longTTL + time.Second)
			tx := h.beginTx()
			if err := h.consumeTx(tx, h.scope, d, []byte("order")); err != nil {
				h.Fatalf("ConsumeTx: %v", err)
			}
			type trimmed struct {
				n   int
				err error
			}
			done := make(chan trimmed, 1)
			go func() {
				n, err := h.store.Trim(h.ctx, h.scope, 0)
				done <- trimmed{n, err}
			}()
			h.endTx(tx, commit)
			got := <-done
			if got.err != nil {
				h.Fatalf("Trim beside a ConsumeTx (commit %v): %v", commit, got.err)
			}
			h.invalid(h.scope, newer, "an unused token trimmed by Trim(0)")
			if commit {
				h.used(h.scope, d, []byte("order"))
				if got.n != 1 {
					h.Fatalf("Trim(0) beside a committed ConsumeTx removed %d, want 1 (the unused token only)", got.n)
				}
				continue
			}
			// Rolled back: the trim took the token, or left it unused.
			if err := h.consume(h.scope, d, []byte("after")); err != nil && !errors.Is(err, token.ErrInvalid) {
				h.Fatalf("Consume after a rolled-back ConsumeTx and a Trim = %v, want nil or ErrInvalid", err)
			}
		}
	}},
}

func (h *harness) consumeTx(tx *sql.Tx, scope, d string, result []byte) error {
	h.Helper()
	return h.store.(token.TxStore).ConsumeTx(h.ctx, tx, scope, d, token.Spend{Result: result})
}

func (h *harness) beginTx() *sql.Tx {
	h.Helper()
	tx, err := h.caps.BeginTx(h.ctx)
	if err != nil {
		h.Fatalf("Caps.BeginTx: %v", err)
	}
	h.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func (h *harness) endTx(tx *sql.Tx, commit bool) {
	h.Helper()
	var err error
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		h.Fatalf("ending the transaction (commit %v): %v", commit, err)
	}
}
