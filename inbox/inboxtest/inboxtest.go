// Package inboxtest is the conformance suite of inbox.Store: every store
// runs it against a real server. Run calls the store directly, under
// fresh groups and message IDs, and checks what each operation answers
// and what it leaves in the record (Get).
package inboxtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
)

// Caps says what a store offers beyond inbox.Store.
type Caps struct {
	// BeginTx, when set, enables the ClaimTx cases; it begins a
	// transaction on the store's database. The store must then implement
	// inbox.TxStore.
	BeginTx func(ctx context.Context) (*sql.Tx, error)
	// ExpiresByItself says that the store removes old records on its own
	// and its Sweep removes nothing: Sweep is not checked. Otherwise the
	// sweeping cases need a store that no one else uses while they run.
	ExpiresByItself bool
}

// Run runs the suite against the stores newStore returns (called once
// per case; it may return the same store every time).
func Run(t *testing.T, newStore func(t *testing.T) inbox.Store, caps Caps) {
	t.Helper()
	if newStore == nil {
		t.Fatal("inboxtest.Run: newStore is nil")
	}
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
	serial bool
	tx     bool
	run    func(h *harness)
}

func (c testCase) exec(t *testing.T, newStore func(t *testing.T) inbox.Store, caps Caps) {
	if c.tx && caps.BeginTx == nil {
		t.Skip("Caps.BeginTx is nil: the store does not claim inside a caller's transaction")
	}
	if c.serial && caps.ExpiresByItself {
		t.Skip("the store removes old records by itself")
	}
	s := newStore(t)
	if s == nil {
		t.Fatal("newStore returned nil")
	}
	h := &harness{T: t, ctx: t.Context(), store: s, caps: caps, group: "inboxtest:" + c.name + ":" + strings.ToLower(rand.Text()[:10])}
	if c.tx {
		ts, ok := s.(inbox.TxStore)
		if !ok {
			t.Fatalf("Caps.BeginTx is set but %T does not implement inbox.TxStore", s)
		}
		h.tx = ts
	}
	c.run(h)
}

const (
	long  = time.Hour
	short = 300 * time.Millisecond
	maxA  = 3
	skew  = 2 * time.Second
)

type harness struct {
	*testing.T
	ctx   context.Context
	store inbox.Store
	tx    inbox.TxStore
	caps  Caps
	group string
	n     atomic.Int64
}

func (h *harness) newID() string {
	return "msg-" + rand.Text()[:16]
}

func (h *harness) claim(id string, lease time.Duration, maxAttempts int) inbox.Claim {
	h.Helper()
	c, err := h.store.Claim(h.ctx, h.group, id, lease, maxAttempts)
	if err != nil {
		h.Fatalf("Claim(%s): %v", id, err)
	}
	if c.Claimed {
		if c.Status != inbox.StatusProcessing {
			h.Fatalf("Claim(%s) claimed with status %q, want processing", id, c.Status)
		}
		if d := c.LeaseUntil.Sub(c.Now); d < lease-time.Millisecond || d > lease+skew {
			h.Fatalf("Claim(%s, lease %v): LeaseUntil - Now = %v", id, lease, d)
		}
	}
	if c.Now.IsZero() {
		h.Fatalf("Claim(%s): Now is zero", id)
	}
	return c
}

// claimed fails unless Claim claims id for attempt n with fence f.
func (h *harness) claimed(id string, lease time.Duration, attempts int, fence int64) inbox.Claim {
	h.Helper()
	c := h.claim(id, lease, maxA)
	if !c.Claimed || c.Attempts != attempts || c.Fence != fence {
		h.Fatalf("Claim(%s) = %+v, want claimed, attempt %d, fence %d", id, c, attempts, fence)
	}
	return c
}

// notClaimed fails unless Claim leaves id with status st.
func (h *harness) notClaimed(id string, st inbox.Status, attempts int, fence int64) inbox.Claim {
	h.Helper()
	c := h.claim(id, long, maxA)
	if c.Claimed || c.Status != st || c.Attempts != attempts || c.Fence != fence {
		h.Fatalf("Claim(%s) = %+v, want not claimed, %s, attempts %d, fence %d", id, c, st, attempts, fence)
	}
	return c
}

func (h *harness) get(id string) inbox.Record {
	h.Helper()
	r, err := h.store.Get(h.ctx, h.group, id)
	if err != nil {
		h.Fatalf("Get(%s): %v", id, err)
	}
	if r.Group != h.group || r.ID != id {
		h.Fatalf("Get(%s) = record of (%q, %q)", id, r.Group, r.ID)
	}
	return r
}

func (h *harness) want(id string, st inbox.Status, attempts int, fence int64) inbox.Record {
	h.Helper()
	r := h.get(id)
	if r.Status != st || r.Attempts != attempts || r.Fence != fence {
		h.Fatalf("record %s = %s, attempts %d, fence %d; want %s, %d, %d", id, r.Status, r.Attempts, r.Fence, st, attempts, fence)
	}
	return r
}

func (h *harness) fenced(op string, err error) {
	h.Helper()
	if !errors.Is(err, inbox.ErrFenced) {
		h.Fatalf("%s with a stale fence = %v, want inbox.ErrFenced", op, err)
	}
}

func (h *harness) sleepPast(d time.Duration) { time.Sleep(d + 150*time.Millisecond) }

var cases = []testCase{
	{name: "ClaimNew", run: func(h *harness) {
		id := h.newID()
		if _, err := h.store.Get(h.ctx, h.group, id); !errors.Is(err, inbox.ErrNotFound) {
			h.Fatalf("Get of an unclaimed message = %v, want inbox.ErrNotFound", err)
		}
		before := time.Now()
		h.claimed(id, long, 1, 1)
		r := h.want(id, inbox.StatusProcessing, 1, 1)
		if r.CreatedAt.Before(before.Add(-skew)) || r.CreatedAt.After(time.Now().Add(skew)) {
			h.Fatalf("CreatedAt %v is not the store's now", r.CreatedAt)
		}
		if r.LeaseUntil.Before(before.Add(long - skew)) {
			h.Fatalf("LeaseUntil %v, want about now + %v", r.LeaseUntil, long)
		}
	}},
	{name: "HeldIsInProgress", run: func(h *harness) {
		id := h.newID()
		h.claimed(id, long, 1, 1)
		c := h.notClaimed(id, inbox.StatusProcessing, 1, 1)
		if !c.LeaseUntil.After(c.Now) {
			h.Fatalf("a held record's LeaseUntil %v is not after Now %v", c.LeaseUntil, c.Now)
		}
		h.want(id, inbox.StatusProcessing, 1, 1)
	}},
	{name: "FinishThenDuplicate", run: func(h *harness) {
		id := h.newID()
		c := h.claimed(id, long, 1, 1)
		if err := h.store.Finish(h.ctx, h.group, id, c.Fence); err != nil {
			h.Fatalf("Finish: %v", err)
		}
		h.want(id, inbox.StatusSucceeded, 1, 1)
		for range 3 {
			h.notClaimed(id, inbox.StatusSucceeded, 1, 1)
		}
		h.fenced("a second Finish", h.store.Finish(h.ctx, h.group, id, c.Fence))
		_, err := h.store.Fail(h.ctx, h.group, id, c.Fence, maxA, "late")
		h.fenced("Fail after Finish", err)
		h.want(id, inbox.StatusSucceeded, 1, 1)
	}},
	{name: "FailedIsRetried", run: func(h *harness) {
		id := h.newID()
		c := h.claimed(id, long, 1, 1)
		st, err := h.store.Fail(h.ctx, h.group, id, c.Fence, maxA, "boom: ünïcode")
		if err != nil || st != inbox.StatusFailed {
			h.Fatalf("Fail = %q, %v; want failed", st, err)
		}
		if r := h.want(id, inbox.StatusFailed, 1, 1); r.LastError != "boom: ünïcode" {
			h.Fatalf("LastError = %q", r.LastError)
		}
		c = h.claimed(id, long, 2, 2)
		if err := h.store.Finish(h.ctx, h.group, id, c.Fence); err != nil {
			h.Fatalf("Finish of the second attempt: %v", err)
		}
		h.want(id, inbox.StatusSucceeded, 2, 2)
	}},
	{name: "DeadAfterMaxAttempts", run: func(h *harness) {
		id := h.newID()
		for i := 1; i <= maxA; i++ {
			c := h.claimed(id, long, i, int64(i))
			st, err := h.store.Fail(h.ctx, h.group, id, c.Fence, maxA, "poison")
			want := inbox.StatusFailed
			if i == maxA {
				want = inbox.StatusDead
			}
			if err != nil || st != want {
				h.Fatalf("Fail of attempt %d = %q, %v; want %s", i, st, err, want)
			}
		}
		h.want(id, inbox.StatusDead, maxA, maxA)
		h.notClaimed(id, inbox.StatusDead, maxA, maxA)
	}},
	{name: "ExpiredLeaseTakenOver", run: func(h *harness) {
		id := h.newID()
		old := h.claimed(id, short, 1, 1)
		h.sleepPast(short)
		c := h.claimed(id, long, 2, 2)
		h.fenced("Finish", h.store.Finish(h.ctx, h.group, id, old.Fence))
		_, err := h.store.Fail(h.ctx, h.group, id, old.Fence, maxA, "old")
		h.fenced("Fail", err)
		h.fenced("Extend", h.store.Extend(h.ctx, h.group, id, old.Fence, long))
		h.want(id, inbox.StatusProcessing, 2, 2)
		if err := h.store.Finish(h.ctx, h.group, id, c.Fence); err != nil {
			h.Fatalf("Finish of the new holder: %v", err)
		}
		h.want(id, inbox.StatusSucceeded, 2, 2)
	}},
	{name: "ExpiredLastAttemptIsDead", run: func(h *harness) {
		id := h.newID()
		c, err := h.store.Claim(h.ctx, h.group, id, short, 1)
		if err != nil || !c.Claimed {
			h.Fatalf("Claim = %+v, %v", c, err)
		}
		h.sleepPast(short)
		c, err = h.store.Claim(h.ctx, h.group, id, long, 1)
		if err != nil || c.Claimed || c.Status != inbox.StatusDead {
			h.Fatalf("Claim after the last attempt's lease ended = %+v, %v; want dead", c, err)
		}
		h.want(id, inbox.StatusDead, 1, 1)
	}},
	{name: "FinishAfterLeaseEndedUntaken", run: func(h *harness) {
		id := h.newID()
		c := h.claimed(id, short, 1, 1)
		h.sleepPast(short)
		if err := h.store.Finish(h.ctx, h.group, id, c.Fence); err != nil {
			h.Fatalf("Finish after the lease ended, nobody took over: %v", err)
		}
		h.want(id, inbox.StatusSucceeded, 1, 1)
	}},
	{name: "Extend", run: func(h *harness) {
		id := h.newID()
		c := h.claimed(id, short, 1, 1)
		h.fenced("Extend", h.store.Extend(h.ctx, h.group, id, c.Fence+1, long))
		if err := h.store.Extend(h.ctx, h.group, id, c.Fence, long); err != nil {
			h.Fatalf("Extend: %v", err)
		}
		h.sleepPast(short)
		h.notClaimed(id, inbox.StatusProcessing, 1, 1)
		if r := h.get(id); r.LeaseUntil.Before(time.Now().Add(long - skew)) {
			h.Fatalf("LeaseUntil %v after Extend(%v)", r.LeaseUntil, long)
		}
		id2 := h.newID()
		c = h.claimed(id2, short, 1, 1)
		h.sleepPast(short)
		h.fenced("Extend after the lease ended", h.store.Extend(h.ctx, h.group, id2, c.Fence, long))
	}},
	{name: "GroupsAndIDsIsolated", run: func(h *harness) {
		id := h.newID()
		c := h.claimed(id, long, 1, 1)
		if err := h.store.Finish(h.ctx, h.group, id, c.Fence); err != nil {
			h.Fatal(err)
		}
		other, err := h.store.Claim(h.ctx, h.group+":other", id, long, maxA)
		if err != nil || !other.Claimed || other.Fence != 1 {
			h.Fatalf("Claim in another group = %+v, %v; want claimed, fence 1", other, err)
		}
		h.claimed(id+"x", long, 1, 1)
		h.claimed(strings.ToUpper(id), long, 1, 1)
		h.want(id, inbox.StatusSucceeded, 1, 1)
	}},
	{name: "RaceClaim", run: func(h *harness) {
		for range 5 {
			id := h.newID()
			var wins atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 32)
			for range 32 {
				wg.Go(func() {
					c, err := h.store.Claim(h.ctx, h.group, id, long, maxA)
					if err != nil {
						errs <- err
						return
					}
					if c.Claimed {
						wins.Add(1)
					} else if c.Status != inbox.StatusProcessing || c.Fence != 1 {
						errs <- errors.New("a losing claim saw " + string(c.Status))
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				h.Fatal(err)
			}
			if wins.Load() != 1 {
				h.Fatalf("%d claims won, want 1", wins.Load())
			}
			h.want(id, inbox.StatusProcessing, 1, 1)
		}
	}},
	{name: "TxCommitIsDuplicate", tx: true, run: func(h *harness) {
		id := h.newID()
		tx, err := h.caps.BeginTx(h.ctx)
		if err != nil {
			h.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck
		c, err := h.tx.ClaimTx(h.ctx, tx, h.group, id, maxA)
		if err != nil || !c.Claimed || c.Status != inbox.StatusSucceeded || c.Fence != 1 || c.Attempts != 1 {
			h.Fatalf("ClaimTx = %+v, %v; want claimed, succeeded (on commit), attempt 1, fence 1", c, err)
		}
		if err := tx.Commit(); err != nil {
			h.Fatal(err)
		}
		h.want(id, inbox.StatusSucceeded, 1, 1)
		h.notClaimed(id, inbox.StatusSucceeded, 1, 1)
	}},
	{name: "TxRollbackLeavesNothing", tx: true, run: func(h *harness) {
		id := h.newID()
		for range 2 {
			tx, err := h.caps.BeginTx(h.ctx)
			if err != nil {
				h.Fatal(err)
			}
			c, err := h.tx.ClaimTx(h.ctx, tx, h.group, id, maxA)
			if err != nil || !c.Claimed || c.Fence != 1 {
				h.Fatalf("ClaimTx = %+v, %v", c, err)
			}
			if err := tx.Rollback(); err != nil {
				h.Fatal(err)
			}
			if _, err := h.store.Get(h.ctx, h.group, id); !errors.Is(err, inbox.ErrNotFound) {
				h.Fatalf("Get after a rolled back claim = %v, want ErrNotFound", err)
			}
		}
		// A failed record, claimed in a transaction that rolls back,
		// stays failed with its attempts.
		c := h.claimed(id, long, 1, 1)
		if _, err := h.store.Fail(h.ctx, h.group, id, c.Fence, maxA, "x"); err != nil {
			h.Fatal(err)
		}
		tx, err := h.caps.BeginTx(h.ctx)
		if err != nil {
			h.Fatal(err)
		}
		if c, err := h.tx.ClaimTx(h.ctx, tx, h.group, id, maxA); err != nil || !c.Claimed || c.Fence != 2 || c.Attempts != 2 {
			h.Fatalf("ClaimTx of a failed record = %+v, %v", c, err)
		}
		_ = tx.Rollback()
		h.want(id, inbox.StatusFailed, 1, 1)
	}},
	{name: "TxConcurrentClaimWaits", tx: true, run: func(h *harness) {
		id := h.newID()
		tx, err := h.caps.BeginTx(h.ctx)
		if err != nil {
			h.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck
		c, err := h.tx.ClaimTx(h.ctx, tx, h.group, id, maxA)
		if err != nil || !c.Claimed {
			h.Fatalf("ClaimTx = %+v, %v", c, err)
		}
		got := make(chan inbox.Claim, 1)
		go func() {
			c, err := h.store.Claim(h.ctx, h.group, id, long, maxA)
			if err != nil {
				h.Errorf("concurrent Claim: %v", err)
			}
			got <- c
		}()
		select {
		case c := <-got:
			h.Fatalf("a Claim during the claiming transaction answered %+v before it ended", c)
		case <-time.After(200 * time.Millisecond):
		}
		if err := tx.Commit(); err != nil {
			h.Fatal(err)
		}
		if c := <-got; c.Claimed || c.Status != inbox.StatusSucceeded {
			h.Fatalf("the waiting Claim = %+v, want succeeded, not claimed", c)
		}
	}},
	{name: "HandleRetriesFailedExtend", run: testHandleRenewsAfterBadExtend(false, 2)},
	{name: "HandleRetriesHungExtend", run: testHandleRenewsAfterBadExtend(true, 1)},
	{name: "Sweep", serial: true, run: testSweep},
	{name: "SweptHolderIsFenced", serial: true, run: testSweptHolder},
}

// sweepRetention is the retention of the sweeping cases: long enough that
// a record written a moment before the sweep is young on a slow machine.
const sweepRetention = 2 * time.Second

// finish finishes the attempt of c, failing the test on an error.
func (h *harness) finish(id string, c inbox.Claim) {
	h.Helper()
	if err := h.store.Finish(h.ctx, h.group, id, c.Fence); err != nil {
		h.Fatalf("Finish(%s): %v", id, err)
	}
}

// fail fails the attempt of c, which must leave the record st.
func (h *harness) fail(id string, c inbox.Claim, maxAttempts int, st inbox.Status) {
	h.Helper()
	if got, err := h.store.Fail(h.ctx, h.group, id, c.Fence, maxAttempts, "x"); err != nil || got != st {
		h.Fatalf("Fail(%s) = %q, %v; want %s", id, got, err, st)
	}
}

// ended writes a record of each status that has ended: succeeded, dead
// (after one attempt) and failed.
func (h *harness) ended() (succeeded, dead, failed string) {
	h.Helper()
	succeeded, dead, failed = h.newID(), h.newID(), h.newID()
	h.finish(succeeded, h.claimed(succeeded, long, 1, 1))
	c := h.claim(dead, long, 1)
	if !c.Claimed {
		h.Fatalf("Claim(%s) = %+v", dead, c)
	}
	h.fail(dead, c, 1, inbox.StatusDead)
	h.fail(failed, h.claimed(failed, long, 1, 1), maxA, inbox.StatusFailed)
	return succeeded, dead, failed
}

func (h *harness) gone(what, id string) {
	h.Helper()
	if r, err := h.store.Get(h.ctx, h.group, id); !errors.Is(err, inbox.ErrNotFound) {
		h.Fatalf("%s record %s after Sweep = %+v, %v; want inbox.ErrNotFound", what, id, r, err)
	}
}

func (h *harness) sweep(retention time.Duration, limit, want int) {
	h.Helper()
	if n, err := h.store.Sweep(h.ctx, retention, limit); err != nil || n != want {
		h.Fatalf("Sweep(retention %v, limit %d) = %d, %v; want %d", retention, limit, n, err, want)
	}
}

// testSweep: Sweep removes the succeeded, dead and failed records last
// updated more than the retention ago and the processing ones whose lease
// ended more than the retention ago, at most limit at a time; it leaves
// those of each status that are younger, and every processing record
// whose lease is live or ended less than the retention ago — also one
// claimed, and so last updated, long before.
func testSweep(h *harness) {
	const r = sweepRetention
	oldDone, oldDead, oldFailed := h.ended()
	abandoned := h.newID()
	h.claimed(abandoned, 50*time.Millisecond, 1, 1)
	live := h.newID()
	h.claimed(live, long, 1, 1)
	// Claimed now; its lease ends when the young records are written, a
	// moment before the sweep: ended, but less than the retention ago.
	endsLate := h.newID()
	h.claimed(endsLate, r+300*time.Millisecond, 1, 1)
	h.sweep(r, 100, 0)

	time.Sleep(r + 300*time.Millisecond)
	youngDone, youngDead, youngFailed := h.ended()
	endedRecently := h.newID()
	h.claimed(endedRecently, 50*time.Millisecond, 1, 1)
	time.Sleep(200 * time.Millisecond)

	h.sweep(r, 2, 2)
	h.sweep(r, 100, 2)
	h.sweep(r, 100, 0)
	h.gone("an old succeeded", oldDone)
	h.gone("an old dead", oldDead)
	h.gone("an old failed", oldFailed)
	h.gone("an abandoned processing", abandoned)
	h.want(youngDone, inbox.StatusSucceeded, 1, 1)
	h.want(youngDead, inbox.StatusDead, 1, 1)
	h.want(youngFailed, inbox.StatusFailed, 1, 1)
	h.want(live, inbox.StatusProcessing, 1, 1)
	h.want(endsLate, inbox.StatusProcessing, 1, 1)
	h.want(endedRecently, inbox.StatusProcessing, 1, 1)
	h.notClaimed(live, inbox.StatusProcessing, 1, 1)
}

// testSweptHolder: a holder whose record was swept long after its lease
// ended is refused by Finish, Fail and Extend, and none of them writes a
// record; a later delivery starts a new record, attempt 1, which the old
// holder's fence does not reach. A failed message's attempts count anew.
func testSweptHolder(h *harness) {
	id, poison := h.newID(), h.newID()
	h.claimed(id, 50*time.Millisecond, 1, 1)
	h.sleepPast(50 * time.Millisecond)
	old := h.claimed(id, 50*time.Millisecond, 2, 2)
	h.fail(poison, h.claimed(poison, long, 1, 1), maxA, inbox.StatusFailed)
	h.fail(poison, h.claimed(poison, long, 2, 2), maxA, inbox.StatusFailed)
	h.sleepPast(50 * time.Millisecond)
	if n, err := h.store.Sweep(h.ctx, 10*time.Millisecond, 1000); err != nil || n < 2 {
		h.Fatalf("Sweep = %d, %v; want at least the 2 records of the case", n, err)
	}
	h.gone("an abandoned processing", id)
	h.gone("a failed", poison)

	h.fenced("Finish of a swept record", h.store.Finish(h.ctx, h.group, id, old.Fence))
	_, err := h.store.Fail(h.ctx, h.group, id, old.Fence, maxA, "late")
	h.fenced("Fail of a swept record", err)
	h.fenced("Extend of a swept record", h.store.Extend(h.ctx, h.group, id, old.Fence, long))
	h.gone("a swept", id)

	h.claimed(id, long, 1, 1)
	h.fenced("Finish of the swept record's holder", h.store.Finish(h.ctx, h.group, id, old.Fence))
	h.want(id, inbox.StatusProcessing, 1, 1)
	h.claimed(poison, long, 1, 1)
}
