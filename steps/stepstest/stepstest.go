// Package stepstest is the conformance suite of package steps: every
// Journal passes it against a real server, with the Runner over it.
//
//	func TestJournal(t *testing.T) {
//		stepstest.Run(t, func(t *testing.T) stepstest.Setup {
//			return stepstest.Setup{Store: store, Journal: journal, DB: db}
//		})
//	}
//
// It checks the journal's contract (fenced writes, checkpoints kept and
// dropped, failures, dead operations, the completer's listing and
// scheduling, retention) and the Runner's behaviour over it: steps run
// once across failures, retries, takeovers and concurrent callers; an
// abandoned operation is finished by the completer; a stale execution
// checkpoints nothing. Effects are counted in the process (foreign
// steps) and in a table of DB (local steps), and those counts are what
// the tests assert.
package stepstest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/steps"
)

// Setup is what a test of the suite runs against.
type Setup struct {
	// Store holds the idempotency records the journal fences by.
	Store idem.Store
	// Journal is the journal under test.
	Journal steps.Journal
	// DB is the journal's database, when the journal is a TxJournal: the
	// suite's local steps write rows of a table there (created if
	// missing: idem_stepstest_effects).
	DB *sql.DB
	// Bind returns the placeholder of the i-th parameter (1-based):
	// "$1" on PostgreSQL. Default "?".
	Bind func(i int) string
}

// Run runs the suite. setup is called by every test (they run in
// parallel, each under keys of its own).
func Run(t *testing.T, setup func(t *testing.T) Setup) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, s Setup)
	}{
		{"BeginFenced", testBeginFenced},
		{"CheckpointsResume", testCheckpointsResume},
		{"StaleLeaseWritesNothing", testStaleLease},
		{"OtherFingerprintWaitsItsTurn", testOtherFingerprint},
		{"FailWaitsThenDies", testFailDies},
		{"DueAndPostpone", testDue},
		{"SettleAndRetry", testSettleRetry},
		{"FinishAndSweep", testFinishSweep},
		{"OpRetriesFromCheckpoint", testOpRetries},
		{"OpDefiniteAnswerReplayed", testOpDefinite},
		{"OpConcurrentCallers", testOpConcurrent},
		{"OpRunInsideExecution", testOpRunInside},
		{"CompleterFinishesAbandoned", testCompleterFinishes},
		{"CompleterDeadAndRetry", testCompleterDead},
		{"CompletersRace", testCompletersRace},
		{"CompleterSparesLiveLastAttempt", testCompleterSparesLive},
		{"StepNamesCheckedBeforeTheCall", testStepNames},
		{"AnyReasonIsKept", testAnyReason},
		{"CompleterShowsOpAnsweredByOthers", testAnsweredByOthers},
		{"CompleterSettlesAnsweredLastAttempt", testCompleterAnsweredLast},
		{"CompleterKeepsOperatorRetry", testCompleterKeepsRetry},
		{"NoOperationUnderAnUnusableKey", testUnusableKey},
		{"LocalStepCommitsWithCheckpoint", testLocalStep},
		{"LocalStepStaleCommitsNothing", testLocalStale},
		{"LocalStepRetriesItsTransaction", testLocalRetry},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			if s.Bind == nil {
				s.Bind = func(int) string { return "?" }
			}
			tc.fn(t, s)
		})
	}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// unique returns a key prefix of the test's own.
func unique(t *testing.T) string { return "st-" + randomHex() }

// randomHex returns 12 random hex digits.
func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// acquire acquires key on the store directly and returns the lease.
func acquire(t *testing.T, ctx context.Context, st idem.Store, key string, fp idem.Fingerprint, lease time.Duration) idem.Lease {
	t.Helper()
	res, err := st.Acquire(ctx, idem.AcquireRequest{Key: key, Fingerprint: fp, Lease: lease, Retention: time.Hour})
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	if res.Outcome != idem.Acquired {
		t.Fatalf("acquire %s: outcome %v", key, res.Outcome)
	}
	return res.Lease
}

// takeOver waits for l's lease (a short one) to end and takes the key
// over.
func takeOver(t *testing.T, ctx context.Context, st idem.Store, l idem.Lease, fp idem.Fingerprint) idem.Lease {
	t.Helper()
	var out idem.Lease
	eventually(t, ctx, "take the key over", func() (bool, error) {
		res, err := st.Acquire(ctx, idem.AcquireRequest{Key: l.Key, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			return false, err
		}
		out = res.Lease
		return res.Outcome == idem.Acquired, nil
	})
	if out.Fence == l.Fence && out.Owner == l.Owner {
		t.Fatalf("takeover kept the lease %+v", out)
	}
	return out
}

// eventually polls cond every 20 ms until it holds or ctx ends.
func eventually(t *testing.T, ctx context.Context, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: never happened (last error: %v)", what, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// start is the Start of a journal-level test's operation: "op" is made
// unique per test run, so that no completer (of a parallel test, or of
// a later run sharing the database) takes it up.
func start(name string, fp idem.Fingerprint) steps.Start {
	if name == "op" {
		name = opName
	}
	return steps.Start{Name: name, Fingerprint: fp, Input: []byte(`{"n":1}`), After: time.Hour}
}

func testBeginFenced(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	key := unique(t)
	bogus := idem.Lease{Key: key, Owner: "nobody", Fence: 1}
	if _, err := s.Journal.Begin(ctx, bogus, start("op", "fp")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Begin without a record: %v, want ErrLeaseLost", err)
	}
	if err := s.Journal.Save(ctx, bogus, "a", []byte("1")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Save without a record: %v, want ErrLeaseLost", err)
	}
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	wrong := l
	wrong.Owner = "someone-else"
	if _, err := s.Journal.Begin(ctx, wrong, start("op", "fp")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Begin with another owner: %v, want ErrLeaseLost", err)
	}
	if _, err := s.Journal.Get(ctx, "", key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after refused Begins: %v, want ErrNotFound", err)
	}
}

func testCheckpointsResume(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	key := unique(t)
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	r, err := s.Journal.Begin(ctx, l, start("op", "fp"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Attempt != 1 || len(r.Checkpoints) != 0 {
		t.Fatalf("first Begin: %+v", r)
	}
	if err := s.Journal.Save(ctx, l, "a", []byte(`"A"`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Save(ctx, l, "b", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Save(ctx, l, "a", []byte(`"again"`)); !errors.Is(err, steps.ErrStepSaved) {
		t.Fatalf("Save of a saved step: %v, want ErrStepSaved", err)
	}
	r, err = s.Journal.Begin(ctx, l, start("op", "fp"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Attempt != 2 || string(r.Checkpoints["a"]) != `"A"` || len(r.Checkpoints) != 2 {
		t.Fatalf("second Begin: attempt %d, checkpoints %q", r.Attempt, r.Checkpoints)
	}
	if b, ok := r.Checkpoints["b"]; !ok || len(b) != 0 {
		t.Fatalf("empty checkpoint b: %q, %v", b, ok)
	}
	op, err := s.Journal.Get(ctx, "", key)
	if err != nil {
		t.Fatal(err)
	}
	if op.Name != opName || op.Fingerprint != "fp" || op.State != steps.StateRunning || op.Attempts != 2 ||
		string(op.Input) != `{"n":1}` || len(op.Checkpoints) != 2 || op.Checkpoints[0].Step != "a" || op.Checkpoints[1].Step != "b" {
		t.Fatalf("Get: %+v", op)
	}
	if op.NextAt.Before(time.Now().Add(50 * time.Minute)) {
		t.Fatalf("NextAt %v: want about an hour from now (Start.After)", op.NextAt)
	}
}

func testStaleLease(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	key := unique(t)
	old := acquire(t, ctx, s.Store, key, "fp", 300*time.Millisecond)
	if _, err := s.Journal.Begin(ctx, old, start("op", "fp")); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Save(ctx, old, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	cur := takeOver(t, ctx, s.Store, old, "fp")
	if err := s.Journal.Save(ctx, old, "b", []byte("stale")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Save: %v, want ErrLeaseLost", err)
	}
	if _, err := s.Journal.Fail(ctx, old, steps.Failure{Reason: "x", Backoff: time.Second, MaxAttempts: 5}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Fail: %v, want ErrLeaseLost", err)
	}
	if err := s.Journal.Finish(ctx, old, time.Hour); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Finish: %v, want ErrLeaseLost", err)
	}
	if _, err := s.Journal.Begin(ctx, old, start("op", "fp")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale Begin: %v, want ErrLeaseLost", err)
	}
	r, err := s.Journal.Begin(ctx, cur, start("op", "fp"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Checkpoints) != 1 || string(r.Checkpoints["a"]) != "1" || r.Attempt != 2 {
		t.Fatalf("the new owner's Begin: %+v (want a, attempt 2)", r)
	}
}

func testOtherFingerprint(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	key := unique(t)
	l := acquire(t, ctx, s.Store, key, "fp1", time.Minute)
	if _, err := s.Journal.Begin(ctx, l, start("op", "fp1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Save(ctx, l, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	// The key is released and reused by another request: refused while
	// the operation is unfinished, whose steps may be half done.
	if err := s.Store.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	l2 := acquire(t, ctx, s.Store, key, "fp2", time.Minute)
	if _, err := s.Journal.Begin(ctx, l2, steps.Start{Name: opName, Fingerprint: "fp2", Input: []byte("2"), After: time.Hour}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Begin under another fingerprint of an unfinished operation: %v, want ErrMismatch", err)
	}
	if _, err := s.Journal.Begin(ctx, l2, steps.Start{Name: "other", Fingerprint: "fp1", Input: []byte("2"), After: time.Hour}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Begin under another name of an unfinished operation: %v, want ErrMismatch", err)
	}
	if op, err := s.Journal.Get(ctx, "", key); err != nil || op.Fingerprint != "fp1" || op.Attempts != 1 || len(op.Checkpoints) != 1 {
		t.Fatalf("the operation after the refused Begins: %+v, %v", op, err)
	}
	if err := s.Store.Release(ctx, l2); err != nil {
		t.Fatal(err)
	}
	// Its own request finishes it; its record is evicted (or expires),
	// and the key is used again: another operation, from the start.
	l = acquire(t, ctx, s.Store, key, "fp1", time.Minute)
	if _, err := s.Journal.Begin(ctx, l, start("op", "fp1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Store.Complete(ctx, l, idem.Response{StatusCode: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Finish(ctx, l, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Store.Delete(ctx, "", key); err != nil {
		t.Fatal(err)
	}
	l2 = acquire(t, ctx, s.Store, key, "fp2", time.Minute)
	r, err := s.Journal.Begin(ctx, l2, steps.Start{Name: opName, Fingerprint: "fp2", Input: []byte("2"), After: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Checkpoints) != 0 || r.Attempt != 1 {
		t.Fatalf("Begin under another fingerprint: %+v, want no checkpoints, attempt 1", r)
	}
	op, err := s.Journal.Get(ctx, "", key)
	if err != nil {
		t.Fatal(err)
	}
	if op.Fingerprint != "fp2" || string(op.Input) != "2" || len(op.Checkpoints) != 0 {
		t.Fatalf("Get: %+v", op)
	}
}

func testFailDies(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	key := unique(t)
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	f := steps.Failure{Reason: "boom", Backoff: time.Hour, MaxAttempts: 2}
	for attempt := 1; attempt <= 2; attempt++ {
		if _, err := s.Journal.Begin(ctx, l, start("op", "fp")); err != nil {
			t.Fatal(err)
		}
		st, err := s.Journal.Fail(ctx, l, f)
		if err != nil {
			t.Fatal(err)
		}
		want := steps.StateWaiting
		if attempt == 2 {
			want = steps.StateDead
		}
		if st != want {
			t.Fatalf("attempt %d: Fail → %s, want %s", attempt, st, want)
		}
		op, err := s.Journal.Get(ctx, "", key)
		if err != nil {
			t.Fatal(err)
		}
		if op.State != want || op.LastError != "boom" || op.Attempts != attempt {
			t.Fatalf("attempt %d: %+v", attempt, op)
		}
		if want == steps.StateWaiting && op.NextAt.Before(time.Now().Add(50*time.Minute)) {
			t.Fatalf("NextAt %v: want about an hour from now (the backoff)", op.NextAt)
		}
	}
	if _, err := s.Journal.Fail(ctx, l, f); err == nil {
		t.Fatal("Fail of a dead operation: nil error")
	}
}

func testDue(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	p := unique(t)
	due := func() map[string]steps.Entry {
		ops, err := s.Journal.Due(ctx, opName, 1000)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]steps.Entry{}
		for _, o := range ops {
			if len(o.Key) > len(p) && o.Key[:len(p)] == p {
				m[o.Key] = o
			}
		}
		return m
	}
	now := acquire(t, ctx, s.Store, p+"-now", "fp", time.Minute)
	later := acquire(t, ctx, s.Store, p+"-later", "fp", time.Minute)
	for _, c := range []struct {
		l     idem.Lease
		after time.Duration
	}{{now, -time.Second}, {later, time.Hour}} {
		st := start("op", "fp")
		st.After = c.after
		if _, err := s.Journal.Begin(ctx, c.l, st); err != nil {
			t.Fatal(err)
		}
	}
	m := due()
	if _, ok := m[p+"-now"]; !ok || len(m) != 1 {
		t.Fatalf("Due: %v, want only %s-now", m, p)
	}
	if o := m[p+"-now"]; o.Name != opName || string(o.Input) != `{"n":1}` || o.Fingerprint != "fp" {
		t.Fatalf("Due entry: %+v", o)
	}
	if err := s.Journal.Postpone(ctx, "", p+"-now", time.Hour); err != nil {
		t.Fatal(err)
	}
	if m := due(); len(m) != 0 {
		t.Fatalf("Due after Postpone: %v", m)
	}
	if err := s.Journal.Postpone(ctx, "", p+"-later", -time.Second); err != nil {
		t.Fatal(err)
	}
	if _, ok := due()[p+"-later"]; !ok {
		t.Fatal("Postpone into the past: not due")
	}
	// Limit.
	ops, err := s.Journal.Due(ctx, opName, 1)
	if err != nil || len(ops) != 1 {
		t.Fatalf("Due(1): %d, %v", len(ops), err)
	}
}

func testSettleRetry(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	key := unique(t)
	if err := s.Journal.Retry(ctx, "", key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Retry of nothing: %v, want ErrNotFound", err)
	}
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	if _, err := s.Journal.Begin(ctx, l, start("op", "fp")); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Save(ctx, l, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Retry(ctx, "", key); !errors.Is(err, steps.ErrNotRetryable) {
		t.Fatalf("Retry of a running operation: %v, want ErrNotRetryable", err)
	}
	seen, err := s.Journal.Get(ctx, "", key)
	if err != nil {
		t.Fatal(err)
	}
	// Another fingerprint, state or count of attempts than the
	// operation's (it changed since it was read) settles nothing.
	for _, stale := range []func(e *steps.Entry){
		func(e *steps.Entry) { e.Fingerprint = "other" },
		func(e *steps.Entry) { e.State = steps.StateWaiting },
		func(e *steps.Entry) { e.Attempts++ },
	} {
		e := seen
		stale(&e)
		for _, st := range []steps.State{steps.StateDead, steps.StateDone} {
			if err := s.Journal.Settle(ctx, e, st, "no", time.Hour); err != nil {
				t.Fatal(err)
			}
			if op, _ := s.Journal.Get(ctx, "", key); op.State != steps.StateRunning || len(op.Checkpoints) != 1 {
				t.Fatalf("Settle %s of %+v changed the operation: %+v", st, e, op)
			}
		}
	}
	if err := s.Journal.Settle(ctx, seen, steps.StateDead, "cannot resume", 0); err != nil {
		t.Fatal(err)
	}
	op, err := s.Journal.Get(ctx, "", key)
	if err != nil {
		t.Fatal(err)
	}
	if op.State != steps.StateDead || op.LastError != "cannot resume" || len(op.Checkpoints) != 1 {
		t.Fatalf("after Settle dead: %+v", op)
	}
	dead, err := s.Journal.List(ctx, steps.StateDead, 10000)
	if err != nil {
		t.Fatal(err)
	}
	if !hasKey(dead, key) {
		t.Fatal("List(dead) misses the dead operation")
	}
	if err := s.Journal.Retry(ctx, "", key); err != nil {
		t.Fatal(err)
	}
	op, _ = s.Journal.Get(ctx, "", key)
	if op.State != steps.StateWaiting || op.Attempts != 0 || op.NextAt.After(time.Now().Add(time.Minute)) || len(op.Checkpoints) != 1 {
		t.Fatalf("after Retry: %+v (want waiting, 0 attempts, due, checkpoint kept)", op)
	}
	// What was read before the Retry settles nothing.
	if err := s.Journal.Settle(ctx, seen, steps.StateDead, "stale", 0); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Journal.Get(ctx, "", key); e.State != steps.StateWaiting || e.Attempts != 0 {
		t.Fatalf("a Settle of what was read before the Retry: %+v", e)
	}
	if err := s.Journal.Settle(ctx, op, steps.StateDone, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	op, _ = s.Journal.Get(ctx, "", key)
	if op.State != steps.StateDone || len(op.Checkpoints) != 0 || op.ExpiresAt.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("after Settle done: %+v", op)
	}
	if err := s.Journal.Retry(ctx, "", key); !errors.Is(err, steps.ErrNotRetryable) {
		t.Fatalf("Retry of a done operation: %v, want ErrNotRetryable", err)
	}
}

func hasKey(ops []steps.Entry, key string) bool {
	for _, o := range ops {
		if o.Key == key {
			return true
		}
	}
	return false
}

func testFinishSweep(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	key := unique(t)
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	if _, err := s.Journal.Begin(ctx, l, start("op", "fp")); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Save(ctx, l, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Store.Complete(ctx, l, idem.Response{StatusCode: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Finish after the completion, by the lease that completed.
	if err := s.Journal.Finish(ctx, l, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	op, err := s.Journal.Get(ctx, "", key)
	if err != nil {
		t.Fatal(err)
	}
	if op.State != steps.StateDone || len(op.Checkpoints) != 0 || !op.NextAt.IsZero() {
		t.Fatalf("after Finish: %+v", op)
	}
	eventually(t, ctx, "sweep the done operation", func() (bool, error) {
		if _, err := s.Journal.Sweep(ctx, 1000); err != nil {
			return false, err
		}
		_, err := s.Journal.Get(ctx, "", key)
		return errors.Is(err, idem.ErrNotFound), nil
	})
}

// counter counts effects by name.
type counter struct {
	mu   sync.Mutex
	n    map[string]int
	keys map[string]bool
}

func (c *counter) add(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[name]++
	return c.n[name]
}

// first reports whether key is new for name: the other system's
// de-duplication by the Idempotency-Key of a foreign call.
func (c *counter) first(name, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[string]bool{}
	}
	k := name + "\x00" + key
	if c.keys[k] {
		return false
	}
	c.keys[k] = true
	return true
}

func (c *counter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func newRunner(t *testing.T, s Setup, lease time.Duration, cfg *steps.Config) *steps.Runner {
	t.Helper()
	g, err := idem.NewGuard(s.Store, &idem.GuardConfig{Lease: lease, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &steps.Config{}
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Millisecond
	}
	r, err := steps.New(g, s.Journal, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// Transfer is the suite's operation input.
type Transfer struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// Receipt is the suite's operation result.
type Receipt struct {
	Charge string `json:"charge"`
	Ship   string `json:"ship"`
}

// opName is the name of the journal-level tests' operations in this run.
var opName = "op-" + randomHex()

var errFlaky = errors.New("stepstest: flaky downstream")

var errDeclined = &idem.DefiniteError{Code: "declined"}

// twoCalls defines an operation of two foreign steps, each counted under
// "<id>/<step>" in c; fail decides whether a step fails this time.
func twoCalls(t *testing.T, r *steps.Runner, name string, c *counter, fail func(id, step string, n int) error) *steps.Op[Transfer, Receipt] {
	t.Helper()
	op, err := steps.Define(r, name, func(ctx context.Context, s *steps.Run, in Transfer) (Receipt, error) {
		charge, err := steps.Foreign(s, "charge", func(ctx context.Context, key string) (string, error) {
			n := c.add(in.ID + "/charge-call")
			if err := fail(in.ID, "charge", n); err != nil {
				return "", err
			}
			c.add(in.ID + "/charge")
			return "ch-" + key, nil
		})
		if err != nil {
			return Receipt{}, err
		}
		ship, err := steps.Foreign(s, "ship", func(ctx context.Context, key string) (string, error) {
			n := c.add(in.ID + "/ship-call")
			if err := fail(in.ID, "ship", n); err != nil {
				return "", err
			}
			c.add(in.ID + "/ship")
			return "sh-" + key, nil
		})
		if err != nil {
			return Receipt{}, err
		}
		return Receipt{Charge: charge, Ship: ship}, nil
	}, &steps.OpConfig[Transfer, Receipt]{
		Key: func(in Transfer) (string, string, error) { return "", in.ID, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func testOpRetries(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var c counter
	op := twoCalls(t, r, "transfer-"+unique(t), &c, func(id, step string, n int) error {
		if step == "ship" && n == 1 {
			return errFlaky
		}
		return nil
	})
	in := Transfer{ID: unique(t), Amount: 5}
	if _, _, err := op.Call(ctx, in); !errors.Is(err, errFlaky) {
		t.Fatalf("first Call: %v, want the flaky error", err)
	}
	e, err := s.Journal.Get(ctx, "", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateWaiting || e.Attempts != 1 || len(e.Checkpoints) != 1 || e.Checkpoints[0].Step != "charge" {
		t.Fatalf("after the failed attempt: %+v", e)
	}
	out, replayed, err := op.Call(ctx, in)
	if err != nil || replayed {
		t.Fatalf("second Call: %v, replayed %v", err, replayed)
	}
	if c.get(in.ID+"/charge") != 1 || c.get(in.ID+"/charge-call") != 1 || c.get(in.ID+"/ship") != 1 || c.get(in.ID+"/ship-call") != 2 {
		t.Fatalf("effects: %v (want one charge, one ship, after two ship calls)", c.n)
	}
	if out.Charge == "" || out.Ship == "" || out.Charge[3:] == out.Ship[3:] {
		t.Fatalf("result %+v: want derived keys of their own per step", out)
	}
	again, replayed, err := op.Call(ctx, in)
	if err != nil || !replayed || again != out {
		t.Fatalf("replay: %+v, %v, %v; want %+v replayed", again, replayed, err, out)
	}
	if c.get(in.ID+"/ship-call") != 2 {
		t.Fatal("the replay ran a step")
	}
	e, err = s.Journal.Get(ctx, "", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateDone || len(e.Checkpoints) != 0 {
		t.Fatalf("after the answer: %+v", e)
	}
}

func testOpDefinite(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var c counter
	op := twoCalls(t, r, "declines-"+unique(t), &c, func(id, step string, n int) error {
		if step == "charge" {
			return fmt.Errorf("card ending 4242: %w", errDeclined)
		}
		return nil
	})
	in := Transfer{ID: unique(t), Amount: 5}
	for i := range 3 {
		_, replayed, err := op.Call(ctx, in)
		var de *idem.DefiniteError
		if !errors.Is(err, errDeclined) || !errors.As(err, &de) || replayed != (i > 0) || de.Replayed != (i > 0) {
			t.Fatalf("call %d: %v, replayed %v", i, err, replayed)
		}
	}
	if c.get(in.ID+"/charge-call") != 1 || c.get(in.ID+"/ship-call") != 0 {
		t.Fatalf("effects: %v (want one charge call, no ship)", c.n)
	}
	rec, err := s.Store.Get(ctx, "", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != idem.StatusCompleted || rec.Response == nil || rec.Response.StatusCode != 422 {
		t.Fatalf("record: %+v", rec)
	}
	if e, _ := s.Journal.Get(ctx, "", in.ID); e.State != steps.StateDone {
		t.Fatalf("journal: %+v", e)
	}
}

func testOpConcurrent(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var c counter
	op := twoCalls(t, r, "concurrent-"+unique(t), &c, func(id, step string, n int) error {
		if n%3 == 1 { // every step fails its first call
			return errFlaky
		}
		return nil
	})
	const keys, callers = 4, 16
	ids := make([]string, keys)
	for i := range ids {
		ids[i] = unique(t)
	}
	var answers atomic.Int32
	var wg sync.WaitGroup
	for i := range keys * callers {
		wg.Go(func() {
			in := Transfer{ID: ids[i%keys], Amount: 1}
			for ctx.Err() == nil {
				_, _, err := op.Call(ctx, in)
				if err == nil {
					answers.Add(1)
					return
				}
				if !errors.Is(err, errFlaky) && !errors.Is(err, idem.ErrInFlight) {
					t.Errorf("Call: %v", err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	if answers.Load() != keys*callers {
		t.Fatalf("%d callers got the answer, want %d", answers.Load(), keys*callers)
	}
	for _, id := range ids {
		if c.get(id+"/charge") != 1 || c.get(id+"/ship") != 1 {
			t.Fatalf("%s: effects %d charge, %d ship; want 1 and 1", id, c.get(id+"/charge"), c.get(id+"/ship"))
		}
	}
}

func testOpRunInside(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var c counter
	op := twoCalls(t, r, "inside-"+unique(t), &c, func(id, step string, n int) error { return nil })
	g, err := idem.NewGuard(s.Store, &idem.GuardConfig{Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key := unique(t)
	in := Transfer{ID: key, Amount: 3}
	if _, err := op.Run(ctx, in); err == nil {
		t.Fatal("Run outside an execution: nil error")
	}
	var got Receipt
	resp, _, err := g.Do(ctx, "", key, "request-fp", func(ctx context.Context) (idem.Response, error) {
		got, err = op.Run(ctx, in)
		return idem.Response{StatusCode: 500}, err // not stored: Run completed the record
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header["Content-Type"][0] != "application/json" {
		t.Fatalf("stored response: %+v", resp)
	}
	stored, err := idem.DecodeOutcome(idem.JSONCodec[Receipt]{}, resp, false)
	if err != nil || stored != got {
		t.Fatalf("stored %+v (%v), returned %+v", stored, err, got)
	}
	e, err := s.Journal.Get(ctx, "", key)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateDone || e.Fingerprint != "request-fp" {
		t.Fatalf("journal: %+v (want done under the execution's fingerprint)", e)
	}
}

// abandonAt defines an operation whose process "dies" in step dieAt on
// its first run: the step stops the execution's watchdog (as a killed
// process stops renewing) and blocks until release is closed, then
// returns as a zombie would. Effects are counted in c.
func abandonAt(t *testing.T, r *steps.Runner, name, dieAt string, c *counter, release <-chan struct{}, zombie chan<- error) *steps.Op[Transfer, Receipt] {
	t.Helper()
	var once sync.Once
	step := func(s *steps.Run, in Transfer, step string) (string, error) {
		return steps.Foreign(s, step, func(ctx context.Context, key string) (string, error) {
			c.add(in.ID + "/" + step + "-call")
			if c.first(in.ID+"/"+step, key) {
				c.add(in.ID + "/" + step) // the effect, once per key
			}
			die := false
			if step == dieAt {
				once.Do(func() { die = true })
			}
			if die {
				idem.FromContext(ctx).Abandon()
				<-release
			}
			return step + "-" + key, nil
		})
	}
	op, err := steps.Define(r, name, func(ctx context.Context, s *steps.Run, in Transfer) (Receipt, error) {
		charge, err := step(s, in, "charge")
		if err != nil {
			return Receipt{}, err
		}
		ship, err := step(s, in, "ship")
		if err != nil {
			if zombie != nil && s.Attempt() == 1 {
				zombie <- err
			}
			return Receipt{}, err
		}
		return Receipt{Charge: charge, Ship: ship}, nil
	}, &steps.OpConfig[Transfer, Receipt]{Key: func(in Transfer) (string, string, error) { return "", in.ID, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func testCompleterFinishes(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	var c counter
	release, zombie := make(chan struct{}), make(chan error, 1)
	// Two instances: the first dies in "ship" (its lease, a second,
	// then ends), the second completes.
	opName := "ship-order-" + unique(t)
	first := newRunner(t, s, time.Second, nil)
	op1 := abandonAt(t, first, opName, "ship", &c, release, zombie)
	second := newRunner(t, s, time.Minute, nil)
	op2 := abandonAt(t, second, opName, "", &c, nil, nil)
	in := Transfer{ID: unique(t), Amount: 7}
	done := make(chan error, 1)
	go func() { _, _, err := op1.Call(ctx, in); done <- err }()
	eventually(t, ctx, "the first run reaches ship", func() (bool, error) { return c.get(in.ID+"/ship-call") == 1, nil })
	eventually(t, ctx, "the completer finishes the operation", func() (bool, error) {
		if _, err := second.Complete(ctx); err != nil {
			return false, err
		}
		e, err := s.Journal.Get(ctx, "", in.ID)
		return err == nil && e.State == steps.StateDone, err
	})
	close(release)
	// The zombie saves no checkpoint: its context ended with its
	// execution (or, had it not, the fence refuses it).
	if err := <-zombie; !errors.Is(err, idem.ErrLeaseLost) && !errors.Is(err, context.Canceled) {
		t.Fatalf("the zombie's ship checkpoint: %v, want ErrLeaseLost or context.Canceled", err)
	}
	<-done
	// charge was checkpointed before the crash; ship was called again
	// after it (the crash came between its call and its checkpoint), with
	// the same derived key: one effect each at the other system. (A run
	// that loses its lease on a loaded machine calls again, with the
	// same key too.)
	if c.get(in.ID+"/charge") != 1 || c.get(in.ID+"/ship") != 1 {
		t.Fatalf("effects: %d charges, %d ships; want 1 and 1 (calls: %v)", c.get(in.ID+"/charge"), c.get(in.ID+"/ship"), c.n)
	}
	if c.get(in.ID+"/ship-call") < 2 {
		t.Fatalf("ship called %d times: want again after the crash", c.get(in.ID+"/ship-call"))
	}
	out, replayed, err := op2.Call(ctx, in)
	if err != nil || !replayed || out.Charge == "" || out.Ship == "" {
		t.Fatalf("the client's retry after the completer: %+v, %v, %v", out, replayed, err)
	}
	rec, err := s.Store.Get(ctx, "", in.ID)
	if err != nil || rec.Status != idem.StatusCompleted {
		t.Fatalf("record: %+v, %v", rec, err)
	}
}

func testCompleterDead(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, &steps.Config{MaxAttempts: 2, Backoff: time.Millisecond, MaxBackoff: time.Millisecond})
	var c counter
	var broken atomic.Bool
	broken.Store(true)
	op := twoCalls(t, r, "dies-"+unique(t), &c, func(id, step string, n int) error {
		if step == "ship" && broken.Load() {
			return errFlaky
		}
		return nil
	})
	in := Transfer{ID: unique(t), Amount: 1}
	if _, _, err := op.Call(ctx, in); !errors.Is(err, errFlaky) {
		t.Fatalf("first Call: %v", err)
	}
	// The completer runs the second attempt, which fails: dead.
	eventually(t, ctx, "the operation dies", func() (bool, error) {
		if _, err := r.Complete(ctx); err != nil {
			return false, err
		}
		e, err := s.Journal.Get(ctx, "", in.ID)
		return err == nil && e.State == steps.StateDead, err
	})
	if n := c.get(in.ID + "/ship-call"); n != 2 {
		t.Fatalf("ship called %d times before death, want 2", n)
	}
	// A dead operation is not due.
	p, err := r.Complete(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := c.get(in.ID + "/ship-call"); n != 2 {
		t.Fatalf("the completer ran a dead operation (pass %+v)", p)
	}
	if _, err := s.Store.Get(ctx, "", in.ID); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the record of a dead operation: %v, want released", err)
	}
	broken.Store(false)
	if err := r.Retry(ctx, "", in.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the retried operation finishes", func() (bool, error) {
		if _, err := r.Complete(ctx); err != nil {
			return false, err
		}
		e, err := s.Journal.Get(ctx, "", in.ID)
		return err == nil && e.State == steps.StateDone, err
	})
	if c.get(in.ID+"/charge") != 1 || c.get(in.ID+"/ship") != 1 {
		t.Fatalf("effects: %v", c.n)
	}
	out, replayed, err := op.Call(ctx, in)
	if err != nil || !replayed || out.Ship == "" {
		t.Fatalf("replay: %+v, %v, %v", out, replayed, err)
	}
}

func testCompletersRace(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	var c counter
	const n, instances = 12, 4
	p := unique(t)
	// Operations left waiting (their first attempt failed at ship), then
	// several completers at once.
	raceName := "race-" + unique(t)
	var runners []*steps.Runner
	var ops []*steps.Op[Transfer, Receipt]
	for range instances {
		r := newRunner(t, s, time.Minute, &steps.Config{Backoff: time.Millisecond, MaxBackoff: time.Millisecond})
		runners = append(runners, r)
		ops = append(ops, twoCalls(t, r, raceName, &c, func(id, step string, n int) error {
			if step == "ship" && n == 1 {
				return errFlaky
			}
			return nil
		}))
	}
	for i := range n {
		if _, _, err := ops[0].Call(ctx, Transfer{ID: fmt.Sprintf("%s-%d", p, i)}); !errors.Is(err, errFlaky) {
			t.Fatalf("first Call: %v", err)
		}
	}
	eventually(t, ctx, "every operation done", func() (bool, error) {
		var wg sync.WaitGroup
		for _, r := range runners {
			wg.Go(func() { _, _ = r.Complete(ctx) })
		}
		wg.Wait()
		for i := range n {
			e, err := s.Journal.Get(ctx, "", fmt.Sprintf("%s-%d", p, i))
			if err != nil || e.State != steps.StateDone {
				return false, err
			}
		}
		return true, nil
	})
	for i := range n {
		id := fmt.Sprintf("%s-%d", p, i)
		if c.get(id+"/charge") != 1 || c.get(id+"/ship") != 1 {
			t.Fatalf("%s: %d charges, %d ships; want 1 and 1", id, c.get(id+"/charge"), c.get(id+"/ship"))
		}
	}
}

// effects creates the suite's table in s.DB (or skips a journal that
// runs no local steps).
func effects(t *testing.T, s Setup) {
	t.Helper()
	if _, ok := s.Journal.(steps.TxJournal); !ok || s.DB == nil {
		t.Skip("the journal runs no local steps (not a steps.TxJournal, or no Setup.DB)")
	}
	if _, err := s.DB.Exec(`CREATE TABLE IF NOT EXISTS idem_stepstest_effects (op VARCHAR(64) NOT NULL, step VARCHAR(64) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func countEffects(t *testing.T, s Setup, op, step string) int {
	t.Helper()
	var n int
	if err := s.DB.QueryRow(fmt.Sprintf(`SELECT COUNT(*) FROM idem_stepstest_effects WHERE op = %s AND step = %s`, s.Bind(1), s.Bind(2)), op, step).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insertEffect(ctx context.Context, s Setup, tx *sql.Tx, op, step string) error {
	_, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO idem_stepstest_effects (op, step) VALUES (%s, %s)`, s.Bind(1), s.Bind(2)), op, step)
	return err
}

func testLocalStep(t *testing.T, s Setup) {
	effects(t, s)
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var fail atomic.Int32
	fail.Store(1)
	op, err := steps.Define(r, "local-"+unique(t), func(ctx context.Context, run *steps.Run, in Transfer) (int, error) {
		a, err := steps.Local(run, "reserve", func(ctx context.Context, tx *sql.Tx) (int, error) {
			return in.Amount, insertEffect(ctx, s, tx, in.ID, "reserve")
		})
		if err != nil {
			return 0, err
		}
		b, err := steps.Local(run, "book", func(ctx context.Context, tx *sql.Tx) (int, error) {
			if err := insertEffect(ctx, s, tx, in.ID, "book"); err != nil {
				return 0, err
			}
			if fail.Add(-1) >= 0 {
				return 0, errFlaky // rolls the insert back
			}
			return a * 2, nil
		})
		return a + b, err
	}, &steps.OpConfig[Transfer, int]{Key: func(in Transfer) (string, string, error) { return "", in.ID, nil }})
	if err != nil {
		t.Fatal(err)
	}
	in := Transfer{ID: unique(t), Amount: 10}
	if _, _, err := op.Call(ctx, in); !errors.Is(err, errFlaky) {
		t.Fatalf("first Call: %v", err)
	}
	if countEffects(t, s, in.ID, "reserve") != 1 || countEffects(t, s, in.ID, "book") != 0 {
		t.Fatal("after a failed book: want reserve committed, book rolled back")
	}
	out, _, err := op.Call(ctx, in)
	if err != nil || out != 30 {
		t.Fatalf("second Call: %d, %v", out, err)
	}
	if countEffects(t, s, in.ID, "reserve") != 1 || countEffects(t, s, in.ID, "book") != 1 {
		t.Fatalf("after the answer: reserve %d, book %d; want 1 and 1", countEffects(t, s, in.ID, "reserve"), countEffects(t, s, in.ID, "book"))
	}
}

// A local step whose Retry allows it runs its transaction again within
// the run: the rolled-back tries leave nothing, the run answers at once.
// Retry's refusal, or LocalTries tries, end the step with the error.
func testLocalRetry(t *testing.T, s Setup) {
	effects(t, s)
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var tries atomic.Int32
	op, err := steps.Define(r, "local-retry-"+unique(t), func(ctx context.Context, run *steps.Run, in Transfer) (int, error) {
		step := steps.Step[int]{Name: "book", Retry: func(err error) bool { return errors.Is(err, errFlaky) }}
		return step.Local(run, func(ctx context.Context, tx *sql.Tx) (int, error) {
			if err := insertEffect(ctx, s, tx, in.ID, "book"); err != nil {
				return 0, err
			}
			if n := tries.Add(1); n <= int32(in.Amount) {
				return 0, errFlaky // rolls the insert back; runs again
			}
			return in.Amount, nil
		})
	}, &steps.OpConfig[Transfer, int]{Key: func(in Transfer) (string, string, error) { return "", in.ID, nil }})
	if err != nil {
		t.Fatal(err)
	}
	in := Transfer{ID: unique(t), Amount: 2}
	if out, _, err := op.Call(ctx, in); err != nil || out != 2 || tries.Load() != 3 {
		t.Fatalf("Call: %d, %v after %d tries; want 2 after 3 tries", out, err, tries.Load())
	}
	if n := countEffects(t, s, in.ID, "book"); n != 1 {
		t.Fatalf("book committed %d times, want 1", n)
	}
	tries.Store(0)
	always := Transfer{ID: unique(t), Amount: 1000}
	if _, _, err := op.Call(ctx, always); !errors.Is(err, errFlaky) || tries.Load() != steps.LocalTries {
		t.Fatalf("Call that always fails: %v after %d tries; want errFlaky after %d", err, tries.Load(), steps.LocalTries)
	}
	if n := countEffects(t, s, always.ID, "book"); n != 0 {
		t.Fatalf("a step that never committed left %d rows", n)
	}
}

func testLocalStale(t *testing.T, s Setup) {
	effects(t, s)
	ctx := ctxOf(t)
	tj := s.Journal.(steps.TxJournal)
	key := unique(t)
	old := acquire(t, ctx, s.Store, key, "fp", 300*time.Millisecond)
	if _, err := tj.Begin(ctx, old, start("op", "fp")); err != nil {
		t.Fatal(err)
	}
	cur := takeOver(t, ctx, s.Store, old, "fp")
	// The stale execution's local step: its writes and its checkpoint
	// must not commit.
	tx, err := tj.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := insertEffect(ctx, s, tx, key, "book"); err != nil {
		t.Fatal(err)
	}
	if err := tj.SaveTx(ctx, tx, old, "book", []byte("1")); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale SaveTx: %v, want ErrLeaseLost", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	// The current one's commits.
	tx, err = tj.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := insertEffect(ctx, s, tx, key, "book"); err != nil {
		t.Fatal(err)
	}
	if err := tj.SaveTx(ctx, tx, cur, "book", []byte("2")); err != nil {
		t.Fatalf("SaveTx: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := countEffects(t, s, key, "book"); n != 1 {
		t.Fatalf("book committed %d times, want 1", n)
	}
	r, err := tj.Begin(ctx, cur, start("op", "fp"))
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Checkpoints["book"]) != "2" {
		t.Fatalf("checkpoints %q: want the current run's book", r.Checkpoints)
	}
	// FinishTx, in the transaction that completes the record.
	tx, err = tj.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tj.FinishTx(ctx, tx, old, time.Hour); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale FinishTx: %v, want ErrLeaseLost", err)
	}
	_ = tx.Rollback()
	tx, err = tj.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tj.FinishTx(ctx, tx, cur, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if e, err := tj.Get(ctx, "", key); err != nil || e.State != steps.StateDone {
		t.Fatalf("after FinishTx: %+v, %v", e, err)
	}
}

// testCompleterSparesLive: an operation on its last attempt whose run is
// alive (longer than its lease, the watchdog renewing it) is in flight,
// not dead: the completer postpones it, and the run's checkpoints and
// answer stand.
func testCompleterSparesLive(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Second, &steps.Config{MaxAttempts: 1})
	var c counter
	entered, release := make(chan struct{}), make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	op, err := steps.Define(r, "long-"+unique(t), func(ctx context.Context, run *steps.Run, in Transfer) (string, error) {
		return steps.Foreign(run, "charge", func(ctx context.Context, key string) (string, error) {
			c.add(in.ID + "/charge")
			close(entered)
			<-release
			return "ch-" + key, nil
		})
	}, &steps.OpConfig[Transfer, string]{Key: func(in Transfer) (string, string, error) { return "", in.ID, nil }})
	if err != nil {
		t.Fatal(err)
	}
	in := Transfer{ID: unique(t), Amount: 1}
	done := make(chan error, 1)
	go func() { _, _, err := op.Call(ctx, in); done <- err }()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("Call ended before its step: %v", err)
	}
	// The run outlives its lease (1 s) and Start.After: the operation
	// comes due while the run holds its key.
	eventually(t, ctx, "the running operation comes due", func() (bool, error) {
		p, err := r.Complete(ctx)
		return p.Due > 0, err
	})
	e, err := s.Journal.Get(ctx, "", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateRunning {
		t.Fatalf("the completer made a live operation %s: %+v", e.State, e)
	}
	unblock()
	if err := <-done; err != nil {
		t.Fatalf("the live run: %v", err)
	}
	if e, err := s.Journal.Get(ctx, "", in.ID); err != nil || e.State != steps.StateDone {
		t.Fatalf("after the live run: %+v, %v", e, err)
	}
	if n := c.get(in.ID + "/charge"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// testCompleterAnsweredLastAttempt: an operation whose last attempt
// stored its answer and died before the journal's Finish is done, not
// dead: its record answers every retry.
func testCompleterAnsweredLast(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, &steps.Config{MaxAttempts: 1})
	var c counter
	name := "answered-" + unique(t)
	if _, err := steps.Define(r, name, func(ctx context.Context, run *steps.Run, in Transfer) (string, error) {
		c.add(in.ID)
		return "again", nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	key := unique(t)
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	if _, err := s.Journal.Begin(ctx, l, steps.Start{Name: name, Fingerprint: "fp", Input: []byte(`{"id":"x"}`), After: -time.Second}); err != nil {
		t.Fatal(err)
	}
	resp, _, _ := idem.EncodeOutcome[string](idem.JSONCodec[string]{}, "first", nil)
	if err := s.Store.Complete(ctx, l, resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	// The process dies here, before Finish.
	e, err := settled(t, ctx, r, s, key, steps.StateRunning)
	if err != nil || e.State != steps.StateDone {
		t.Fatalf("an answered operation: %+v, %v; want done", e, err)
	}
	if c.get("x") != 0 {
		t.Fatal("the completer ran an answered operation")
	}
}

// testStepNames: a step's name is its checkpoint's key in the journal.
// A name no journal can keep (empty, over 255 bytes, not UTF-8, with a
// NUL) is refused before the step runs: a foreign call whose checkpoint
// cannot be saved would be made again on every attempt. Any other name
// (up to 255 bytes of any script) is kept as it is.
func testStepNames(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var c counter
	long := strings.Repeat("é", 127) + "x" // 255 bytes
	name := "names-" + unique(t)
	op, err := steps.Define(r, name, func(ctx context.Context, run *steps.Run, in Transfer) (string, error) {
		return steps.Foreign(run, in.ID[strings.IndexByte(in.ID, '|')+1:], func(ctx context.Context, key string) (string, error) {
			c.add(in.ID)
			return "ok", nil
		})
	}, &steps.OpConfig[Transfer, string]{Key: func(in Transfer) (string, string, error) {
		return "", in.ID[:strings.IndexByte(in.ID, '|')], nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", long + "y", "a\x00b", "\xff\xfe", "tab\tstep"} {
		in := Transfer{ID: unique(t) + "|" + bad}
		if _, _, err := op.Call(ctx, in); err == nil {
			t.Fatalf("step %q: nil error", bad)
		}
		if n := c.get(in.ID); n != 0 {
			t.Fatalf("step %q: called %d times, want refused before the call", bad, n)
		}
	}
	for _, good := range []string{long, "naïve step/1", "💳 charge"} {
		in := Transfer{ID: unique(t) + "|" + good}
		if _, _, err := op.Call(ctx, in); err != nil {
			t.Fatalf("step %q: %v", good, err)
		}
		if n := c.get(in.ID); n != 1 {
			t.Fatalf("step %q: called %d times, want 1", good, n)
		}
	}
	// Kept as they are: a resumed run finds them.
	key := unique(t)
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	if _, err := s.Journal.Begin(ctx, l, start("op", "fp")); err != nil {
		t.Fatal(err)
	}
	if err := s.Journal.Save(ctx, l, long, []byte("1")); err != nil {
		t.Fatal(err)
	}
	res, err := s.Journal.Begin(ctx, l, start("op", "fp"))
	if err != nil || string(res.Checkpoints[long]) != "1" {
		t.Fatalf("Begin: %q, %v; want the long name's checkpoint", res.Checkpoints, err)
	}
}

// testAnyReason: an attempt's error may say anything (a downstream's
// body, binary, long, in any script): Fail and Settle keep it (or a
// prefix of it, as valid UTF-8) and never fail on it, or the failure
// would go uncounted.
func testAnyReason(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	reasons := []string{
		strings.Repeat("a", 1999) + strings.Repeat("é", 2000), // a cut inside a character
		strings.Repeat("日本", 5000),
		"nul\x00inside",
		"bad \xff\xfe bytes",
	}
	for i, reason := range reasons {
		key := unique(t)
		l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
		if _, err := s.Journal.Begin(ctx, l, start("op", "fp")); err != nil {
			t.Fatal(err)
		}
		st, err := s.Journal.Fail(ctx, l, steps.Failure{Reason: reason, Backoff: time.Hour, MaxAttempts: 5})
		if err != nil || st != steps.StateWaiting {
			t.Fatalf("reason %d: Fail → %s, %v", i, st, err)
		}
		e, err := s.Journal.Get(ctx, "", key)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.ValidString(e.LastError) || !strings.HasPrefix(e.LastError, reason[:3]) {
			t.Fatalf("reason %d: LastError %q", i, e.LastError)
		}
		if err := s.Journal.Settle(ctx, e, steps.StateDead, reason, 0); err != nil {
			t.Fatalf("reason %d: Settle dead: %v", i, err)
		}
		if e, err := s.Journal.Get(ctx, "", key); err != nil || e.State != steps.StateDead || !utf8.ValidString(e.LastError) {
			t.Fatalf("reason %d: after Settle: %+v, %v", i, e, err)
		}
	}
}

// testAnsweredByOthers: an operation run inside a handler's execution
// (Run) fails after a step with a retryable error, and the handler
// stores an answer of its own (a 400, which idemhttp keeps) instead of
// letting the key go. The operation's steps are half done and no run
// will finish them: the completer must leave it dead, for an operator
// to see, not done.
func testAnsweredByOthers(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	r := newRunner(t, s, time.Minute, nil)
	var c counter
	op := twoCalls(t, r, "others-"+unique(t), &c, func(id, step string, n int) error {
		if step == "ship" {
			return errFlaky
		}
		return nil
	})
	g, err := idem.NewGuard(s.Store, &idem.GuardConfig{Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key := unique(t)
	resp, _, err := g.Do(ctx, "", key, "request-fp", func(ctx context.Context) (idem.Response, error) {
		if _, err := op.Run(ctx, Transfer{ID: key, Amount: 2}); !errors.Is(err, errFlaky) {
			t.Errorf("Run: %v, want the flaky error", err)
		}
		return idem.Response{StatusCode: 400, Body: []byte("bad request")}, nil
	})
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("handler: %+v, %v", resp, err)
	}
	e, err := settled(t, ctx, r, s, key, steps.StateWaiting)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateDead || len(e.Checkpoints) != 1 {
		t.Fatalf("an operation half done under another answer: %+v; want dead with its charge checkpoint", e)
	}
	if c.get(key+"/charge") != 1 {
		t.Fatalf("effects: %v", c.n)
	}
}

// settled runs passes of r's completer until key's operation has left
// state from, and returns it.
func settled(t *testing.T, ctx context.Context, r *steps.Runner, s Setup, key string, from steps.State) (steps.Entry, error) {
	t.Helper()
	eventually(t, ctx, "the completer settles the operation", func() (bool, error) {
		if _, err := r.Complete(ctx); err != nil {
			return false, err
		}
		e, err := s.Journal.Get(ctx, "", key)
		return err == nil && e.State != from, err
	})
	return s.Journal.Get(ctx, "", key)
}

// hookJournal runs a hook of the test's after Due has read and before
// Settle writes: the window in which a completer decides from what it
// read.
type hookJournal struct {
	steps.Journal
	mu          sync.Mutex
	due, settle func()
}

func (h *hookJournal) take(f *func()) func() {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := *f
	*f = nil
	return g
}

func (h *hookJournal) Due(ctx context.Context, name string, limit int) ([]steps.Entry, error) {
	ops, err := h.Journal.Due(ctx, name, limit)
	if f := h.take(&h.due); f != nil {
		f()
	}
	return ops, err
}

func (h *hookJournal) Settle(ctx context.Context, seen steps.Entry, state steps.State, reason string, retention time.Duration) error {
	if f := h.take(&h.settle); f != nil {
		f()
	}
	return h.Journal.Settle(ctx, seen, state, reason, retention)
}

// testCompleterKeepsRetry: the completer reads an operation on its last
// attempt (one MaxAttempts for every party), running, its run seemingly
// gone. That run then fails (dead) and lets the key go; the completer
// acquires the key to settle the operation dead, and an operator's
// Retry lands just before its Settle. The Settle must not undo the
// Retry: the operation stays due with its attempts from 0, and the next
// pass runs it.
func testCompleterKeepsRetry(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	hj := &hookJournal{Journal: s.Journal}
	hs := s
	hs.Journal = hj
	r := newRunner(t, hs, time.Minute, &steps.Config{MaxAttempts: 1})
	var c counter
	name := "retried-" + unique(t)
	key := unique(t)
	if _, err := steps.Define(r, name, func(ctx context.Context, run *steps.Run, in Transfer) (string, error) {
		c.add(key)
		return "ok", nil
	}, nil); err != nil {
		t.Fatal(err)
	}
	l := acquire(t, ctx, s.Store, key, "fp", time.Minute)
	if _, err := s.Journal.Begin(ctx, l, steps.Start{Name: name, Fingerprint: "fp", Input: []byte(`{"id":"x"}`), After: -time.Second}); err != nil {
		t.Fatal(err)
	}
	var hookErr error
	hj.due = func() {
		st, err := s.Journal.Fail(ctx, l, steps.Failure{Reason: "flaky", Backoff: time.Hour, MaxAttempts: 1})
		if err != nil || st != steps.StateDead {
			hookErr = fmt.Errorf("the last run's Fail: %s, %v; want dead", st, err)
			return
		}
		hookErr = s.Store.Release(ctx, l)
	}
	hj.settle = func() {
		if err := s.Journal.Retry(ctx, "", key); err != nil && hookErr == nil {
			hookErr = fmt.Errorf("the operator's Retry: %w", err)
		}
	}
	if _, err := r.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	if hj.take(&hj.settle) != nil {
		t.Fatal("the completer did not settle the operation (the test's interleaving did not happen)")
	}
	e, err := s.Journal.Get(ctx, "", key)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateWaiting || e.Attempts != 0 {
		t.Fatalf("after the operator's Retry and the completer's Settle: %s with %d attempts (%q); want waiting with 0: the Retry was undone", e.State, e.Attempts, e.LastError)
	}
	e, err = settled(t, ctx, r, s, key, steps.StateWaiting)
	if err != nil || e.State != steps.StateDone {
		t.Fatalf("the retried operation: %+v, %v; want done", e, err)
	}
	if n := c.get(key); n != 1 {
		t.Fatalf("the retried operation ran %d times, want 1", n)
	}
}

// testUnusableKey: an operator may type any scope and key (idem ops,
// the operator page's form). One that no idempotency record can have
// (not UTF-8, a NUL or another control character, over 255 bytes) has
// no operation either: Get and Retry answer idem.ErrNotFound, as for
// any key without one, not a database's error about the bytes.
func testUnusableKey(t *testing.T, s Setup) {
	ctx := ctxOf(t)
	long := strings.Repeat("k", idem.MaxKeyLen+1)
	for _, id := range [][2]string{{"", "bad\xff\xfe"}, {"", "nul\x00"}, {"", "esc\x1b[2J"}, {"", long}, {"bad\xff", "k"}, {"nul\x00", "k"}, {long, "k"}} {
		if _, err := s.Journal.Get(ctx, id[0], id[1]); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get(%q, %.20q…): %v; want idem.ErrNotFound", id[0], id[1], err)
		}
		if err := s.Journal.Retry(ctx, id[0], id[1]); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Retry(%q, %.20q…): %v; want idem.ErrNotFound", id[0], id[1], err)
		}
	}
}
