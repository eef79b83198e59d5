package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/inboxtest"
)

func TestMemoryConformance(t *testing.T) {
	s := inbox.NewMemoryStore()
	inboxtest.Run(t, func(*testing.T) inbox.Store { return s }, inboxtest.Caps{})
}

func newInbox(t *testing.T, cfg inbox.Config) (*inbox.Inbox, *inbox.MemoryStore) {
	t.Helper()
	s := inbox.NewMemoryStore()
	if cfg.Group == "" {
		cfg.Group = "g"
	}
	in, err := inbox.New(s, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in, s
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	s := inbox.NewMemoryStore()
	for _, c := range []struct {
		name string
		cfg  *inbox.Config
	}{
		{"nil config", nil},
		{"no group", &inbox.Config{}},
		{"control character", &inbox.Config{Group: "a\nb"}},
		{"long group", &inbox.Config{Group: strings.Repeat("g", 256)}},
		{"negative attempts", &inbox.Config{Group: "g", MaxAttempts: -1}},
		{"tiny lease", &inbox.Config{Group: "g", Lease: time.Millisecond}},
	} {
		if _, err := inbox.New(s, c.cfg); err == nil {
			t.Errorf("%s: New succeeded", c.name)
		}
	}
	if _, err := inbox.New(nil, &inbox.Config{Group: "g"}); err == nil {
		t.Error("New(nil store) succeeded")
	}
}

func TestHandleSameMessageFiveTimes(t *testing.T) {
	t.Parallel()
	in, s := newInbox(t, inbox.Config{})
	var effects atomic.Int64
	var results []inbox.Result
	for range 5 {
		o, err := in.Handle(t.Context(), inbox.Message{ID: "m1"}, func(context.Context, inbox.Delivery) error {
			effects.Add(1)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, o.Result)
	}
	if effects.Load() != 1 {
		t.Fatalf("%d effects, want 1", effects.Load())
	}
	want := []inbox.Result{inbox.Processed, inbox.Duplicate, inbox.Duplicate, inbox.Duplicate, inbox.Duplicate}
	if fmt.Sprint(results) != fmt.Sprint(want) {
		t.Fatalf("results %v, want %v", results, want)
	}
	if r, _ := s.Get(t.Context(), "g", "m1"); r.Status != inbox.StatusSucceeded || r.Attempts != 1 {
		t.Fatalf("record %+v", r)
	}
}

func TestHandleFailsTwiceThenSucceeds(t *testing.T) {
	t.Parallel()
	in, s := newInbox(t, inbox.Config{})
	calls, effects := 0, 0
	h := func(_ context.Context, d inbox.Delivery) error {
		calls++
		if calls <= 2 {
			return errors.New("transient")
		}
		if d.Attempt != 3 || d.Fence != 3 {
			t.Errorf("third delivery: attempt %d fence %d", d.Attempt, d.Fence)
		}
		effects++
		return nil
	}
	for i, want := range []inbox.Result{inbox.Retry, inbox.Retry, inbox.Processed, inbox.Duplicate} {
		o, err := in.Handle(t.Context(), inbox.Message{ID: "m"}, h)
		if err != nil || o.Result != want {
			t.Fatalf("delivery %d: %v (%v), want %v", i+1, o.Result, err, want)
		}
		if want == inbox.Retry && (o.Delay <= 0 || o.Err == nil) {
			t.Fatalf("delivery %d: retry without delay or error: %+v", i+1, o)
		}
	}
	if effects != 1 {
		t.Fatalf("%d effects", effects)
	}
	if r, _ := s.Get(t.Context(), "g", "m"); r.Status != inbox.StatusSucceeded || r.Attempts != 3 || r.LastError != "transient" {
		t.Fatalf("record %+v", r)
	}
}

func TestHandlePoisonGoesDead(t *testing.T) {
	t.Parallel()
	in, s := newInbox(t, inbox.Config{MaxAttempts: 3})
	var good atomic.Int64
	h := func(_ context.Context, d inbox.Delivery) error {
		if strings.HasPrefix(d.ID, "poison") {
			panic("cannot parse")
		}
		good.Add(1)
		return nil
	}
	var last inbox.Outcome
	for i := range 5 {
		o, err := in.Handle(t.Context(), inbox.Message{ID: "poison"}, h)
		if err != nil {
			t.Fatal(err)
		}
		last = o
		if _, err := in.Handle(t.Context(), inbox.Message{ID: fmt.Sprint("ok-", i)}, h); err != nil {
			t.Fatal(err)
		}
	}
	var pe *inbox.PanicError
	if last.Result != inbox.Dead {
		t.Fatalf("poison's last outcome %+v, want dead", last)
	}
	r, _ := s.Get(t.Context(), "g", "poison")
	if r.Status != inbox.StatusDead || r.Attempts != 3 {
		t.Fatalf("poison record %+v", r)
	}
	o, _ := in.Handle(t.Context(), inbox.Message{ID: "poison2"}, h)
	if !errors.As(o.Err, &pe) {
		t.Fatalf("a panicking handler's Err = %v", o.Err)
	}
	if good.Load() != 5 {
		t.Fatalf("%d other messages handled, want 5", good.Load())
	}
}

func TestHandleInProgressElsewhere(t *testing.T) {
	t.Parallel()
	in, _ := newInbox(t, inbox.Config{Lease: time.Hour})
	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		o, err := in.Handle(t.Context(), inbox.Message{ID: "m"}, func(context.Context, inbox.Delivery) error {
			close(started)
			<-release
			return nil
		})
		if err != nil || o.Result != inbox.Processed {
			t.Errorf("first: %+v %v", o, err)
		}
	})
	<-started
	o, err := in.Handle(t.Context(), inbox.Message{ID: "m"}, func(context.Context, inbox.Delivery) error {
		t.Error("handler ran for a message in progress")
		return nil
	})
	if err != nil || o.Result != inbox.InProgress || o.Delay < 59*time.Minute {
		t.Fatalf("second: %+v %v", o, err)
	}
	close(release)
	wg.Wait()
}

// slowExtend is a MemoryStore whose renewals arrive late: a holder
// paused past its lease.
type slowExtend struct{ *inbox.MemoryStore }

func (s slowExtend) Extend(ctx context.Context, group, id string, fence int64, lease time.Duration) error {
	time.Sleep(2 * lease)
	return s.MemoryStore.Extend(ctx, group, id, fence, lease)
}

func TestHandleLeaseLostCancelsHandler(t *testing.T) {
	t.Parallel()
	s := slowExtend{inbox.NewMemoryStore()}
	in, err := inbox.New(s, &inbox.Config{Group: "g", Lease: 60 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o, err := in.Handle(t.Context(), inbox.Message{ID: "m"}, func(ctx context.Context, d inbox.Delivery) error {
		// The first renewal comes after the lease ended: another delivery
		// takes the message over meanwhile.
		for {
			c, err := s.Claim(context.Background(), "g", "m", time.Hour, 5)
			if err != nil {
				return err
			}
			if c.Claimed {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), inbox.ErrLeaseLost) {
			t.Errorf("cause %v", context.Cause(ctx))
		}
		return nil
	})
	if !errors.Is(err, inbox.ErrFenced) || o.Result != inbox.Retry {
		t.Fatalf("Handle = %+v, %v; want Retry, ErrFenced", o, err)
	}
	if r, _ := s.Get(t.Context(), "g", "m"); r.Status != inbox.StatusProcessing || r.Fence != 2 {
		t.Fatalf("record %+v, want the new holder's", r)
	}
}

func TestMissingID(t *testing.T) {
	t.Parallel()
	in, s := newInbox(t, inbox.Config{})
	ran := false
	o, err := in.Handle(t.Context(), inbox.Message{Topic: "t"}, func(context.Context, inbox.Delivery) error { ran = true; return nil })
	if err != nil || o.Result != inbox.Dead || !errors.Is(o.Err, inbox.ErrNoID) || ran {
		t.Fatalf("no ID: %+v %v ran=%v", o, err, ran)
	}
	in2, err := inbox.New(s, &inbox.Config{Group: "g2", DeriveFrom: func(m inbox.Message) []string {
		return []string{m.Key, m.Topic, m.Headers["version"]}
	}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	m := inbox.Message{Topic: "order.paid", Key: "order-1", Headers: map[string]string{"version": "3"}}
	for range 3 {
		o, err := in2.Handle(t.Context(), m, func(context.Context, inbox.Delivery) error { n++; return nil })
		if err != nil || o.ID != inbox.DeriveID("order-1", "order.paid", "3") {
			t.Fatalf("derived: %+v %v", o, err)
		}
	}
	if n != 1 {
		t.Fatalf("%d effects of a message with a derived ID", n)
	}
}

func TestDeriveID(t *testing.T) {
	t.Parallel()
	a, b := inbox.DeriveID("ab", "c"), inbox.DeriveID("a", "bc")
	if a == b || a != inbox.DeriveID("ab", "c") || len(a) != len("sha256:")+64 {
		t.Fatalf("DeriveID: %s %s", a, b)
	}
	if err := inbox.Validate(a); err != nil {
		t.Fatal(err)
	}
}

func TestHandleTxNeedsTxStore(t *testing.T) {
	t.Parallel()
	in, _ := newInbox(t, inbox.Config{})
	if _, err := in.HandleTx(t.Context(), nil, inbox.Message{ID: "m"}, nil); !errors.Is(err, inbox.ErrTxUnsupported) {
		t.Fatalf("HandleTx on a MemoryStore = %v", err)
	}
}

func TestResultString(t *testing.T) {
	t.Parallel()
	for r, want := range map[inbox.Result]string{inbox.Processed: "processed", inbox.InProgress: "in progress", 0: "inbox.Result(0)"} {
		if r.String() != want {
			t.Errorf("%d: %q", r, r.String())
		}
	}
	if !inbox.Duplicate.Ack() || inbox.Retry.Ack() {
		t.Error("Ack")
	}
}

func FuzzValidate(f *testing.F) {
	f.Add("msg-1")
	f.Add("a\x00")
	f.Fuzz(func(t *testing.T, s string) {
		if err := inbox.Validate(s); err == nil && (s == "" || len(s) > inbox.MaxIDLen) {
			t.Fatalf("Validate(%q) accepted", s)
		}
	})
}
