// Package locktest is the conformance suite of lock.Backend: every
// backend runs it against a real server (or, for lock.MemoryBackend, in
// memory).
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) lock.Backend { return newBackend(t) })
//	}
//
// It pins exclusivity, owner-only extension and release (compare-and-
// extend, compare-and-delete), a fence strictly increasing per name
// across acquisitions, releases, expiries and takeovers, expiry letting
// another owner in (never earlier than the TTL), an extension after
// expiry refused, names compared byte for byte, hostile names, and a race
// of goroutines with exactly one winner. The cases wait for leases of a
// few hundred milliseconds to run out, and run in parallel.
package locktest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
)

// Run runs the suite. newBackend is called once per case; it may return
// the same backend each time (every case uses names of its own).
func Run(t *testing.T, newBackend func(t *testing.T) lock.Backend) {
	run := strings.ToLower(rand.Text()[:10])
	cases := []struct {
		name string
		f    func(t *testing.T, b lock.Backend, name func(string) string)
	}{
		{"Exclusive", testExclusive},
		{"ReleaseOwnerOnly", testReleaseOwnerOnly},
		{"ExtendOwnerOnly", testExtendOwnerOnly},
		{"ExtendKeepsHeld", testExtendKeepsHeld},
		{"Expiry", testExpiry},
		{"ExtendAfterExpiry", testExtendAfterExpiry},
		{"FenceIncreases", testFenceIncreases},
		{"NamesByteForByte", testNamesByteForByte},
		{"HostileNames", testHostileNames},
		{"Race", testRace},
		{"Locker", testLocker},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t)
			prefix := "locktest-" + run + "-" + c.name + "-"
			c.f(t, b, func(s string) string { return prefix + s })
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustAcquire(t *testing.T, b lock.Backend, name, owner string, ttl time.Duration) int64 {
	t.Helper()
	f, err := b.Acquire(ctx(t), name, owner, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %s): %v", name, owner, err)
	}
	if f < 1 {
		t.Fatalf("Acquire(%q): fence %d, want ≥ 1", name, f)
	}
	return f
}

func wantHeld(t *testing.T, b lock.Backend, name string) {
	t.Helper()
	f, err := b.Acquire(ctx(t), name, lock.NewOwner(), time.Minute)
	if !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("Acquire(%q) by another owner = %d, %v; want ErrHeld", name, f, err)
	}
}

func wantNotHeld(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("%s = %v, want ErrNotHeld", what, err)
	}
}

func testExclusive(t *testing.T, b lock.Backend, name func(string) string) {
	n := name("x")
	mustAcquire(t, b, n, lock.NewOwner(), time.Minute)
	wantHeld(t, b, n)
	wantHeld(t, b, n)
}

func testReleaseOwnerOnly(t *testing.T, b lock.Backend, name func(string) string) {
	n := name("x")
	a := lock.NewOwner()
	f := mustAcquire(t, b, n, a, time.Minute)
	wantNotHeld(t, "Release by another owner", b.Release(ctx(t), n, lock.NewOwner(), f))
	wantNotHeld(t, "Release with another fence", b.Release(ctx(t), n, a, f+1))
	wantNotHeld(t, "Release of another name", b.Release(ctx(t), name("y"), a, f))
	wantHeld(t, b, n)
	if err := b.Release(ctx(t), n, a, f); err != nil {
		t.Fatalf("Release by the owner: %v", err)
	}
	wantNotHeld(t, "second Release", b.Release(ctx(t), n, a, f))
	wantNotHeld(t, "Extend after Release", b.Extend(ctx(t), n, a, f, time.Minute))
	f2 := mustAcquire(t, b, n, lock.NewOwner(), time.Minute)
	if f2 <= f {
		t.Fatalf("fence after release %d, want > %d", f2, f)
	}
	wantNotHeld(t, "Release by the earlier owner", b.Release(ctx(t), n, a, f))
	wantHeld(t, b, n)
}

func testExtendOwnerOnly(t *testing.T, b lock.Backend, name func(string) string) {
	n := name("x")
	a := lock.NewOwner()
	f := mustAcquire(t, b, n, a, time.Minute)
	wantNotHeld(t, "Extend by another owner", b.Extend(ctx(t), n, lock.NewOwner(), f, time.Minute))
	wantNotHeld(t, "Extend with another fence", b.Extend(ctx(t), n, a, f-1, time.Minute))
	wantNotHeld(t, "Extend of a name never acquired", b.Extend(ctx(t), name("never"), a, f, time.Minute))
	for range 3 { // twice in the same millisecond is fine
		if err := b.Extend(ctx(t), n, a, f, time.Minute); err != nil {
			t.Fatalf("Extend by the owner: %v", err)
		}
	}
	wantHeld(t, b, n)
}

func testExtendKeepsHeld(t *testing.T, b lock.Backend, name func(string) string) {
	n := name("x")
	a := lock.NewOwner()
	// Long enough that the Extend, one round trip after the Acquire,
	// comes within the first lease on a loaded machine too.
	const ttl = 600 * time.Millisecond
	f := mustAcquire(t, b, n, a, ttl)
	if err := b.Extend(ctx(t), n, a, f, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	time.Sleep(ttl + 250*time.Millisecond) // past the first lease on any clock and rounding, well within the second
	wantHeld(t, b, n)
	if err := b.Extend(ctx(t), n, a, f, time.Minute); err != nil {
		t.Fatalf("Extend after the first lease's end: %v", err)
	}
	if err := b.Release(ctx(t), n, a, f); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// waitAcquire polls Acquire by owner until it succeeds.
func waitAcquire(t *testing.T, b lock.Backend, name, owner string, ttl time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		f, err := b.Acquire(ctx(t), name, owner, ttl)
		if err == nil {
			return f
		}
		if !errors.Is(err, lock.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("Acquire(%q) while waiting for expiry: %v", name, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testExpiry(t *testing.T, b lock.Backend, name func(string) string) {
	n := name("x")
	a := lock.NewOwner()
	const ttl = 150 * time.Millisecond
	t0 := time.Now() // before the lease began on any clock
	fa := mustAcquire(t, b, n, a, ttl)
	bOwner := lock.NewOwner()
	fb := waitAcquire(t, b, n, bOwner, time.Minute)
	if el := time.Since(t0); el < ttl {
		t.Fatalf("another owner took the lock %v after the acquisition was sent, before the TTL %v", el, ttl)
	}
	if fb <= fa {
		t.Fatalf("fence of the takeover %d, want > %d", fb, fa)
	}
	wantNotHeld(t, "Extend by the expired owner", b.Extend(ctx(t), n, a, fa, time.Minute))
	wantNotHeld(t, "Release by the expired owner", b.Release(ctx(t), n, a, fa))
	wantHeld(t, b, n) // the new owner still holds it
	if err := b.Extend(ctx(t), n, bOwner, fb, time.Minute); err != nil {
		t.Fatalf("Extend by the new owner: %v", err)
	}
	if err := b.Release(ctx(t), n, bOwner, fb); err != nil {
		t.Fatalf("Release by the new owner: %v", err)
	}
}

func testExtendAfterExpiry(t *testing.T, b lock.Backend, name func(string) string) {
	n := name("x")
	a := lock.NewOwner()
	const ttl = 50 * time.Millisecond
	f := mustAcquire(t, b, n, a, ttl)
	time.Sleep(ttl + 250*time.Millisecond) // past the lease, on any clock and rounding
	wantNotHeld(t, "Extend after expiry (nobody took the lock)", b.Extend(ctx(t), n, a, f, time.Minute))
	wantNotHeld(t, "Release after expiry", b.Release(ctx(t), n, a, f))
	f2 := mustAcquire(t, b, n, lock.NewOwner(), time.Minute)
	if f2 <= f {
		t.Fatalf("fence after expiry %d, want > %d", f2, f)
	}
	wantNotHeld(t, "Extend by the expired owner after a new acquisition", b.Extend(ctx(t), n, a, f, time.Minute))
}

func testFenceIncreases(t *testing.T, b lock.Backend, name func(string) string) {
	n := name("x")
	var last int64
	for i := range 20 {
		o := lock.NewOwner()
		f := mustAcquire(t, b, n, o, time.Minute)
		if f <= last {
			t.Fatalf("acquisition %d: fence %d, want > %d", i, f, last)
		}
		last = f
		if err := b.Release(ctx(t), n, o, f); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
	}
	// Another name has a sequence of its own, which does not disturb
	// this one's.
	mustAcquire(t, b, name("other"), lock.NewOwner(), time.Minute)
	if f := mustAcquire(t, b, n, lock.NewOwner(), time.Minute); f <= last {
		t.Fatalf("fence %d after another name's acquisition, want > %d", f, last)
	}
}

func testNamesByteForByte(t *testing.T, b lock.Backend, name func(string) string) {
	// Names a database might compare as equal: case, trailing and
	// leading spaces (PAD SPACE collations), LIKE wildcards, accents,
	// Unicode normalisation forms, Redis hash tags.
	suffixes := []string{"a", "A", "a ", " a", "a  ", "a%", "a_", "á", "a\u0301", "{a}", "a}", "{a", "ß", "ss", "a:fence", "a\u00a0"}
	owners := map[string]string{}
	fences := map[string]int64{}
	for _, s := range suffixes {
		n := name(s)
		owners[n] = lock.NewOwner()
		fences[n] = mustAcquire(t, b, n, owners[n], time.Minute)
	}
	for _, s := range suffixes {
		n := name(s)
		wantHeld(t, b, n)
		if err := b.Extend(ctx(t), n, owners[n], fences[n], time.Minute); err != nil {
			t.Fatalf("Extend(%q): %v", n, err)
		}
	}
	for _, s := range suffixes {
		n := name(s)
		if err := b.Release(ctx(t), n, owners[n], fences[n]); err != nil {
			t.Fatalf("Release(%q): %v", n, err)
		}
	}
	for _, s := range suffixes[1:] { // each name is free again, the first one included
		wantNotHeld(t, fmt.Sprintf("Release(%q) again", name(s)), b.Release(ctx(t), name(s), owners[name(s)], fences[name(s)]))
	}
	mustAcquire(t, b, name(suffixes[0]), lock.NewOwner(), time.Minute)
}

// HostileNames are valid lock names that break careless code: SQL and
// Lua syntax, Redis key patterns and hash tags, non-ASCII text, and the
// longest name.
var HostileNames = []string{
	`'; DROP TABLE idem_locks; --`,
	`" OR "1"="1`,
	`\`, `\\'`, `%`, `_`, `*`, `?`, `[a-z]`,
	`{}`, `}{`, `{x}:fence`, `:`, `..`, `/`,
	"ключ", "鍵", "🔒", "e\u0301",
	strings.Repeat("é", lock.MaxNameLen/2), // 254 bytes
	strings.Repeat("z", lock.MaxNameLen),
}

func testHostileNames(t *testing.T, b lock.Backend, name func(string) string) {
	for i, h := range HostileNames {
		n := h
		if len(h) < lock.MaxNameLen-40 {
			n = name(h) // isolated from other runs
		}
		if err := lock.ValidateName(n); err != nil {
			t.Fatalf("hostile name %d: %v", i, err)
		}
		o := lock.NewOwner()
		f, err := b.Acquire(ctx(t), n, o, time.Minute)
		if errors.Is(err, lock.ErrHeld) && n == h {
			// A long name shared with another run of the suite on the same
			// server: wait for it.
			f = waitAcquire(t, b, n, o, time.Minute)
		} else if err != nil {
			t.Fatalf("Acquire(%q): %v", n, err)
		}
		wantHeld(t, b, n)
		if err := b.Extend(ctx(t), n, o, f, time.Minute); err != nil {
			t.Fatalf("Extend(%q): %v", n, err)
		}
		wantNotHeld(t, fmt.Sprintf("Release(%q) by another owner", n), b.Release(ctx(t), n, lock.NewOwner(), f))
		if err := b.Release(ctx(t), n, o, f); err != nil {
			t.Fatalf("Release(%q): %v", n, err)
		}
		o2 := lock.NewOwner()
		f2 := mustAcquire(t, b, n, o2, time.Minute)
		if f2 <= f {
			t.Fatalf("%q: fence %d after release, want > %d", n, f2, f)
		}
		if err := b.Release(ctx(t), n, o2, f2); err != nil {
			t.Fatalf("Release(%q): %v", n, err)
		}
	}
}

func testRace(t *testing.T, b lock.Backend, name func(string) string) {
	const goroutines = 16
	for round := range 3 {
		n := name(fmt.Sprint(round))
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins, held := 0, 0
		var errs []error
		start := make(chan struct{})
		for range goroutines {
			wg.Go(func() {
				<-start
				_, err := b.Acquire(ctx(t), n, lock.NewOwner(), time.Minute)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
				case errors.Is(err, lock.ErrHeld):
					held++
				default:
					errs = append(errs, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %d errors, first: %v", round, len(errs), errs[0])
		}
		if wins != 1 || held != goroutines-1 {
			t.Fatalf("round %d: %d acquisitions and %d ErrHeld among %d goroutines, want 1 and %d", round, wins, held, goroutines, goroutines-1)
		}
	}
}

// testLocker runs a Locker over the backend: its watchdog keeps the lock
// held across several TTLs, and a release lets another in with a
// greater fence. Each renewal has two thirds of the TTL, 600 ms, to be
// answered: a timer late on a loaded machine and a slow round trip
// together missed 200 ms.
func testLocker(t *testing.T, b lock.Backend, name func(string) string) {
	const ttl = 900 * time.Millisecond
	l, err := lock.New(b, &lock.Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	n := name("x")
	lease, err := l.TryAcquire(ctx(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		if _, err := l.TryAcquire(ctx(t), n); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("TryAcquire while the watchdog renews: %v, want ErrHeld", err)
		}
		if err := lease.Err(); err != nil {
			t.Fatalf("lease ended while the backend answers: %v", err)
		}
		time.Sleep(ttl / 5)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !errors.Is(lease.Err(), lock.ErrReleased) {
		t.Fatalf("Err after Release = %v, want ErrReleased", lease.Err())
	}
	next, err := l.Acquire(ctx(t), n)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	if next.Fence() <= lease.Fence() {
		t.Fatalf("fence %d after release, want > %d", next.Fence(), lease.Fence())
	}
	if err := next.Release(ctx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
