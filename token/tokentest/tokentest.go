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
	return h.store.Consume(h.ctx, scope, d, result)
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
		for _, scope := range []string{h.scope, h.scope + ":other"} {
			if _, err := h.store.Insert(h.ctx, scope, d, longTTL); !errors.Is(err, token.ErrDuplicate) {
				h.Fatalf("Insert of a stored digest under %q = %v, want token.ErrDuplicate", scope, err)
			}
		}
		// The token is still the first Insert's, unused.
		h.invalid(h.scope+":other", d, "a token whose duplicate Insert failed")
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
		if err := h.store.Consume(ctx, h.scope, d, []byte("x")); !errors.Is(err, context.Canceled) {
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
				errs[i] = h.store.Consume(h.ctx, h.scope, d, fmt.Appendf(nil, "result-%d", i))
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
		const n = 20
		d := newDigest(h)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				_, errs[i] = h.store.Insert(h.ctx, fmt.Sprintf("%s:%d", h.scope, i), d, longTTL)
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				h.Fatalf("goroutines %d and %d both inserted the digest", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, token.ErrDuplicate):
				h.Fatalf("goroutine %d: Insert = %v, want nil or token.ErrDuplicate", i, err)
			}
		}
		if winner < 0 {
			h.Fatal("no goroutine inserted the digest")
		}
		owner := fmt.Sprintf("%s:%d", h.scope, winner)
		for i := range n {
			if i != winner {
				h.invalid(fmt.Sprintf("%s:%d", h.scope, i), d, "a token whose Insert lost the race")
			}
		}
		h.first(owner, d, nil)
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
			go func() { done <- h.store.Consume(h.ctx, h.scope, d, []byte("outside")) }()
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
}

func (h *harness) consumeTx(tx *sql.Tx, scope, d string, result []byte) error {
	h.Helper()
	return h.store.(token.TxStore).ConsumeTx(h.ctx, tx, scope, d, result)
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
