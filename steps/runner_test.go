package steps_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/steps"
)

// memRunner returns a Runner over a memstore and a Memory journal.
func memRunner(t *testing.T, cfg *steps.Config) (*steps.Runner, idem.Store) {
	t.Helper()
	st := memstore.New(nil)
	g, err := idem.NewGuard(st, &idem.GuardConfig{Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	j, err := steps.NewMemory(st)
	if err != nil {
		t.Fatal(err)
	}
	r, err := steps.New(g, j, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, st
}

// A function that panics when the completer resumes it must not take
// the completer's process down: the pass counts a failed attempt, the
// key is released and the journal says why, and the operation finishes
// once the function stops panicking.
func TestCompleterSurvivesPanic(t *testing.T) {
	ctx := context.Background()
	r, st := memRunner(t, &steps.Config{Backoff: time.Millisecond, MaxBackoff: time.Millisecond})
	var mode atomic.Int32 // 0: fail, 1: panic, 2: succeed
	var charges atomic.Int32
	op, err := steps.Define(r, "panics", func(ctx context.Context, s *steps.Run, id string) (string, error) {
		charge, err := steps.Foreign(s, "charge", func(ctx context.Context, key string) (string, error) {
			charges.Add(1)
			return "ch-" + key, nil
		})
		if err != nil {
			return "", err
		}
		switch mode.Load() {
		case 0:
			return "", errors.New("downstream unavailable")
		case 1:
			panic("bug in the second step")
		}
		return charge, nil
	}, &steps.OpConfig[string, string]{Key: func(id string) (string, string, error) { return "", id, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := op.Call(ctx, "o1"); err == nil {
		t.Fatal("first Call: nil error")
	}
	mode.Store(1)
	var p steps.Pass
	for p.Due == 0 { // the backoff (1 ms) must pass
		p, err = r.Complete(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	if p.Failed != 1 || p.Errors != 0 {
		t.Fatalf("pass %+v: want one failed attempt", p)
	}
	e, err := r.Journal().Get(ctx, "", "o1")
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateWaiting || e.Attempts != 2 || !strings.Contains(e.LastError, "bug in the second step") {
		t.Fatalf("after the panic: %+v", e)
	}
	if _, err := st.Get(ctx, "", "o1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record after the panic: %v, want released", err)
	}
	mode.Store(2)
	for {
		if _, err := r.Complete(ctx); err != nil {
			t.Fatal(err)
		}
		if e, err = r.Journal().Get(ctx, "", "o1"); err != nil || e.State == steps.StateDone {
			break
		}
	}
	if err != nil || charges.Load() != 1 {
		t.Fatalf("journal %+v, %v; %d charges, want 1", e, err, charges.Load())
	}
}

// A panic in a client's Call is the client's (it propagates), and the
// attempt is counted as failed with the panic as its reason.
func TestCallPanicRecordsFailure(t *testing.T) {
	ctx := context.Background()
	r, _ := memRunner(t, nil)
	op, err := steps.Define(r, "panics-call", func(ctx context.Context, s *steps.Run, id string) (string, error) {
		panic("boom")
	}, &steps.OpConfig[string, string]{Key: func(id string) (string, string, error) { return "", id, nil }})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the function's panic", p)
			}
		}()
		_, _, _ = op.Call(ctx, "o2")
	}()
	e, err := r.Journal().Get(ctx, "", "o2")
	if err != nil {
		t.Fatal(err)
	}
	if e.State != steps.StateWaiting || !strings.Contains(e.LastError, "boom") {
		t.Fatalf("after the panic: %+v", e)
	}
}

// An operation's name is the journal's: one no journal can keep is
// refused by Define.
func TestDefineChecksName(t *testing.T) {
	r, _ := memRunner(t, nil)
	fn := func(ctx context.Context, s *steps.Run, id string) (string, error) { return id, nil }
	for _, name := range []string{"", strings.Repeat("n", 256), "a\x00b", "\xff", "line\nbreak"} {
		if _, err := steps.Define(r, name, fn, nil); err == nil {
			t.Errorf("Define(%q): nil error", name)
		}
	}
	if _, err := steps.Define(r, strings.Repeat("é", 127)+"x", fn, nil); err != nil {
		t.Errorf("Define of a 255-byte name: %v", err)
	}
}

// However many attempts failed, and however large MaxBackoff is, the
// next one waits a backoff from now: never one in the past (a doubling
// or the jitter overflowing), which would make a failing operation due
// at once, again and again.
func TestBackoffNeverOverflows(t *testing.T) {
	ctx := context.Background()
	r, _ := memRunner(t, &steps.Config{MaxAttempts: 100, Backoff: time.Hour, MaxBackoff: math.MaxInt64})
	op, err := steps.Define(r, "always-fails", func(ctx context.Context, s *steps.Run, id string) (string, error) {
		return "", errors.New("downstream unavailable")
	}, &steps.OpConfig[string, string]{Key: func(id string) (string, string, error) { return "", id, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 80; attempt++ {
		if _, _, err := op.Call(ctx, "o3"); err == nil {
			t.Fatal("Call: nil error")
		}
		e, err := r.Journal().Get(ctx, "", "o3")
		if err != nil {
			t.Fatal(err)
		}
		if e.State != steps.StateWaiting || !e.NextAt.After(time.Now().Add(30*time.Minute)) {
			t.Fatalf("attempt %d: %s, next at %v: want waiting, at least the first backoff away", attempt, e.State, e.NextAt)
		}
	}
}

// An instance that cannot decode an operation's input (an older build
// during a rolling deploy) must not mark it dead while a newer instance
// runs it: the key is in flight, and the operation is postponed.
func TestUndecodableInputSparesLiveRun(t *testing.T) {
	ctx := context.Background()
	st := memstore.New(nil)
	j, err := steps.NewMemory(st)
	if err != nil {
		t.Fatal(err)
	}
	runner := func() *steps.Runner {
		g, err := idem.NewGuard(st, &idem.GuardConfig{Lease: time.Second, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		r, err := steps.New(g, j, &steps.Config{Backoff: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	type order struct{ N int }
	entered, release := make(chan struct{}), make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	newer := runner()
	op, err := steps.Define(newer, "order", func(ctx context.Context, s *steps.Run, in order) (int, error) {
		return steps.Foreign(s, "charge", func(ctx context.Context, key string) (int, error) {
			close(entered)
			<-release
			return in.N, nil
		})
	}, &steps.OpConfig[order, int]{Key: func(in order) (string, string, error) { return "", "o4", nil }})
	if err != nil {
		t.Fatal(err)
	}
	older := runner()
	if _, err := steps.Define(older, "order", func(ctx context.Context, s *steps.Run, in []string) (int, error) {
		return 0, errors.New("the older build ran")
	}, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, _, err := op.Call(ctx, order{N: 7}); done <- err }()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("Call ended before its step: %v", err)
	}
	for {
		p, err := older.Complete(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Due > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling for the due time, not for an outcome
	}
	if e, err := j.Get(ctx, "", "o4"); err != nil || e.State != steps.StateRunning {
		t.Fatalf("while the newer instance runs it: %+v, %v; want running", e, err)
	}
	unblock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if e, err := j.Get(ctx, "", "o4"); err != nil || e.State != steps.StateDone {
		t.Fatalf("after the run: %+v, %v", e, err)
	}
}

// Close may be called from several goroutines at once (a shutdown hook
// and a deferred Close): each returns once the completer has stopped.
func TestCloseConcurrent(t *testing.T) {
	for range 200 {
		r, _ := memRunner(t, &steps.Config{Interval: time.Hour})
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				if err := r.Close(); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
}
