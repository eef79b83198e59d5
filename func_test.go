package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

type charge struct {
	OrderID string `json:"order_id"`
	Cents   int    `json:"cents"`
}

type receipt struct {
	ChargeID string `json:"charge_id"`
	Cents    int    `json:"cents"`
}

var errDeclined = &idem.DefiniteError{Code: "card_declined"}

// payments is a fake provider: it counts the charges it made.
type payments struct {
	mu      sync.Mutex
	charges map[string]int // order → charges made
	next    int
	fail    func(in charge) error // nil: every charge succeeds
}

func (p *payments) charge(ctx context.Context, in charge) (receipt, error) {
	if p.fail != nil {
		if err := p.fail(in); err != nil {
			return receipt{}, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.charges == nil {
		p.charges = map[string]int{}
	}
	p.charges[in.OrderID]++
	p.next++
	return receipt{ChargeID: "ch_" + strconv.Itoa(p.next), Cents: in.Cents}, nil
}

func (p *payments) count(order string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges[order]
}

func byOrder(in charge) (string, string, error) { return "shop", "charge:" + in.OrderID, nil }

func newFunc(t *testing.T, s idem.Store, fn func(context.Context, charge) (receipt, error), cfg *idem.FuncConfig[charge, receipt]) *idem.Func[charge, receipt] {
	t.Helper()
	g, err := idem.NewGuard(s, &idem.GuardConfig{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &idem.FuncConfig[charge, receipt]{Key: byOrder}
	}
	f, err := idem.Wrap(g, fn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFuncRunsOncePerKey(t *testing.T) {
	s := memstore.New(nil)
	p := &payments{}
	f := newFunc(t, s, p.charge, nil)
	ctx := t.Context()
	first, replayed, err := f.Call(ctx, charge{OrderID: "o1", Cents: 500})
	if err != nil || replayed || first.ChargeID == "" {
		t.Fatalf("first call = %+v, replayed %v, %v", first, replayed, err)
	}
	again, replayed, err := f.Call(ctx, charge{OrderID: "o1", Cents: 500})
	if err != nil || !replayed || again != first {
		t.Fatalf("second call = %+v, replayed %v, %v; want %+v replayed", again, replayed, err, first)
	}
	if n := p.count("o1"); n != 1 {
		t.Fatalf("charges for o1 = %d, want 1", n)
	}
	// Another key runs.
	if _, _, err := f.Call(ctx, charge{OrderID: "o2", Cents: 500}); err != nil || p.count("o2") != 1 {
		t.Fatalf("o2: %v, %d charges", err, p.count("o2"))
	}
	// The same key with another input is refused, and charges nothing.
	if _, _, err := f.Call(ctx, charge{OrderID: "o1", Cents: 900}); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("same key, other input: %v, want ErrMismatch", err)
	}
	if n := p.count("o1"); n != 1 {
		t.Fatalf("charges for o1 = %d after a mismatch, want 1", n)
	}
	// The record holds the encoded result.
	rec, err := s.Get(ctx, "shop", "charge:o1")
	if err != nil || rec.Status != idem.StatusCompleted || rec.Response.StatusCode != 200 ||
		string(rec.Response.Body) != fmt.Sprintf(`{"charge_id":%q,"cents":500}`, first.ChargeID) {
		t.Fatalf("record = %+v, %v", rec, err)
	}
}

func TestFuncConcurrentCallers(t *testing.T) {
	s := memstore.New(nil)
	release := make(chan struct{})
	p := &payments{fail: func(charge) error { <-release; return nil }}
	f := newFunc(t, s, p.charge, nil)
	const callers = 50
	var wg sync.WaitGroup
	var ok, inFlight, other atomic.Int64
	var entered sync.WaitGroup
	entered.Add(callers - 1)
	for range callers {
		wg.Go(func() {
			_, _, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 100})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, idem.ErrInFlight):
				inFlight.Add(1)
				entered.Done()
			default:
				other.Add(1)
				t.Error(err)
			}
		})
	}
	entered.Wait() // every caller but the one running has been turned away
	close(release)
	wg.Wait()
	if ok.Load() != 1 || inFlight.Load() != callers-1 || other.Load() != 0 {
		t.Fatalf("ok %d, in flight %d, other %d", ok.Load(), inFlight.Load(), other.Load())
	}
	if n := p.count("o1"); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
	// Every caller retrying now gets the one result.
	for range 5 {
		if _, replayed, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 100}); err != nil || !replayed {
			t.Fatalf("retry: replayed %v, %v", replayed, err)
		}
	}
}

func TestFuncDefiniteErrorStored(t *testing.T) {
	s := memstore.New(nil)
	var calls atomic.Int64
	decline := func(ctx context.Context, in charge) (receipt, error) {
		calls.Add(1)
		return receipt{}, fmt.Errorf("card ending 4242: %w", errDeclined)
	}
	f := newFunc(t, s, decline, nil)
	_, replayed, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 100})
	if replayed || !errors.Is(err, errDeclined) || err.Error() != "card ending 4242: idem: definite outcome card_declined" {
		t.Fatalf("first = replayed %v, %v", replayed, err)
	}
	_, replayed, err = f.Call(t.Context(), charge{OrderID: "o1", Cents: 100})
	var de *idem.DefiniteError
	if !replayed || !errors.Is(err, errDeclined) || !errors.As(err, &de) || !de.Replayed ||
		de.Message != "card ending 4242: idem: definite outcome card_declined" {
		t.Fatalf("duplicate = replayed %v, %#v", replayed, err)
	}
	if calls.Load() != 1 {
		t.Fatalf("function ran %d times, want 1", calls.Load())
	}
	rec, err := s.Get(t.Context(), "shop", "charge:o1")
	if err != nil || rec.Response.StatusCode != 422 {
		t.Fatalf("record = %+v, %v", rec, err)
	}
}

func TestFuncRetryableErrorReleases(t *testing.T) {
	s := memstore.New(nil)
	var attempts atomic.Int64
	p := &payments{fail: func(charge) error {
		if attempts.Add(1) == 1 {
			return errors.New("provider timed out")
		}
		return nil
	}}
	f := newFunc(t, s, p.charge, nil)
	if _, _, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 100}); err == nil || err.Error() != "provider timed out" {
		t.Fatalf("first = %v", err)
	}
	if _, err := s.Get(t.Context(), "shop", "charge:o1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("after a retryable error the record is %v; want none", err)
	}
	if out, replayed, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 100}); err != nil || replayed || out.ChargeID == "" {
		t.Fatalf("retry = %+v, %v, %v", out, replayed, err)
	}
	if n := p.count("o1"); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
}

func TestFuncPanicReleases(t *testing.T) {
	s := memstore.New(nil)
	var panicked atomic.Bool
	p := &payments{}
	f := newFunc(t, s, func(ctx context.Context, in charge) (receipt, error) {
		if panicked.CompareAndSwap(false, true) {
			panic("boom")
		}
		return p.charge(ctx, in)
	}, nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		_, _, _ = f.Call(t.Context(), charge{OrderID: "o1", Cents: 100})
	}()
	if _, replayed, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 100}); err != nil || replayed || p.count("o1") != 1 {
		t.Fatalf("after a panic: replayed %v, %v, %d charges", replayed, err, p.count("o1"))
	}
}

// unencodable fails to encode: its result must not be run again.
type unencodable struct{ C chan int }

func TestFuncUnencodableResultNotRunAgain(t *testing.T) {
	g, err := idem.NewGuard(memstore.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	f, err := idem.Wrap(g, func(ctx context.Context, in string) (unencodable, error) {
		calls.Add(1)
		return unencodable{C: make(chan int)}, nil
	}, &idem.FuncConfig[string, unencodable]{Key: func(in string) (string, string, error) { return "", in, nil }})
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := f.Call(t.Context(), "k")
	if err == nil || out.C == nil {
		t.Fatalf("first = %+v, %v; want the result and the encoding error", out, err)
	}
	_, replayed, err := f.Call(t.Context(), "k")
	if !replayed || !errors.Is(err, &idem.DefiniteError{Code: idem.CodeUnencodable}) || calls.Load() != 1 {
		t.Fatalf("duplicate = replayed %v, %v; ran %d times", replayed, err, calls.Load())
	}
}

func TestFuncBadConfigAndInput(t *testing.T) {
	g, err := idem.NewGuard(memstore.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	fn := func(ctx context.Context, in charge) (receipt, error) { return receipt{}, nil }
	for name, wrap := range map[string]func() error{
		"nil guard": func() error {
			_, err := idem.Wrap(nil, fn, &idem.FuncConfig[charge, receipt]{Key: byOrder})
			return err
		},
		"nil fn": func() error {
			_, err := idem.Wrap[charge, receipt](g, nil, &idem.FuncConfig[charge, receipt]{Key: byOrder})
			return err
		},
		"nil config": func() error { _, err := idem.Wrap(g, fn, nil); return err },
		"no key":     func() error { _, err := idem.Wrap(g, fn, &idem.FuncConfig[charge, receipt]{}); return err },
	} {
		if err := wrap(); err == nil {
			t.Errorf("%s: Wrap accepted it", name)
		}
	}
	var ran atomic.Int64
	f, err := idem.Wrap(g, func(ctx context.Context, in charge) (receipt, error) { ran.Add(1); return receipt{}, nil },
		&idem.FuncConfig[charge, receipt]{Key: func(in charge) (string, string, error) {
			if in.OrderID == "" {
				return "", "", errors.New("no order id")
			}
			return "shop", in.OrderID, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Call(t.Context(), charge{}); err == nil || err.Error() != "no order id" {
		t.Fatalf("key error = %v", err)
	}
	if _, _, err := f.Call(t.Context(), charge{OrderID: "o\x00"}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("control character in key = %v, want ErrInvalidKey", err)
	}
	if ran.Load() != 0 {
		t.Fatalf("the function ran %d times on bad input", ran.Load())
	}
}

func TestFuncRecordOfAnotherGuard(t *testing.T) {
	s := memstore.New(nil)
	g, err := idem.NewGuard(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := idem.JSONFingerprint(charge{OrderID: "o1", Cents: 1})
	if err != nil {
		t.Fatal(err)
	}
	// An HTTP-shaped record under the key the Func will use.
	if _, _, err := g.Do(t.Context(), "shop", "charge:o1", fp, func(context.Context) (idem.Response, error) {
		return idem.Response{StatusCode: 201, Body: []byte("created")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	p := &payments{}
	f := newFunc(t, s, p.charge, nil)
	if _, replayed, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 1}); !replayed || err == nil || p.count("o1") != 0 {
		t.Fatalf("replayed %v, %v, %d charges; want an error naming the foreign record and no charge", replayed, err, p.count("o1"))
	}
}

func TestJSONFingerprint(t *testing.T) {
	a, err1 := idem.JSONFingerprint(map[string]int{"a": 1, "b": 2})
	b, err2 := idem.JSONFingerprint(map[string]int{"b": 2, "a": 1})
	c, err3 := idem.JSONFingerprint(map[string]int{"a": 1, "b": 3})
	if err1 != nil || err2 != nil || err3 != nil || a != b || a == c || len(a) != len("json1:")+64 {
		t.Fatalf("%q %q %q (%v %v %v)", a, b, c, err1, err2, err3)
	}
	if _, err := idem.JSONFingerprint(make(chan int)); err == nil {
		t.Fatal("a channel was fingerprinted")
	}
}

// upperCodec is a codec of the caller's: it stores the charge ID alone.
type upperCodec struct{}

func (upperCodec) Marshal(r receipt) ([]byte, error) { return []byte(r.ChargeID), nil }
func (upperCodec) Unmarshal(b []byte) (receipt, error) {
	return receipt{ChargeID: string(b), Cents: -1}, nil
}

func TestFuncCodec(t *testing.T) {
	s := memstore.New(nil)
	p := &payments{}
	f := newFunc(t, s, p.charge, &idem.FuncConfig[charge, receipt]{Key: byOrder, Codec: upperCodec{}})
	first, _, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 7})
	if err != nil || first.Cents != 7 {
		t.Fatalf("first = %+v, %v", first, err)
	}
	again, replayed, err := f.Call(t.Context(), charge{OrderID: "o1", Cents: 7})
	if err != nil || !replayed || again.ChargeID != first.ChargeID || again.Cents != -1 {
		t.Fatalf("replay through the codec = %+v, %v, %v", again, replayed, err)
	}
	// Fn has the wrapped function's signature.
	var plain func(context.Context, charge) (receipt, error) = f.Fn()
	if r, err := plain(t.Context(), charge{OrderID: "o1", Cents: 7}); err != nil || r.ChargeID != first.ChargeID || p.count("o1") != 1 {
		t.Fatalf("Fn = %+v, %v, %d charges", r, err, p.count("o1"))
	}
}

// BenchmarkFunc: a replay through Func (memstore) next to a call of the
// bare function and to the same replay through the untyped Guard.Do, in
// one binary.
func BenchmarkFunc(b *testing.B) {
	bare := func(ctx context.Context, in charge) (receipt, error) {
		return receipt{ChargeID: "ch_1", Cents: in.Cents}, nil
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bare(context.Background(), charge{OrderID: "o1", Cents: 5}); err != nil {
				b.Fatal(err)
			}
		}
	})
	g, err := idem.NewGuard(memstore.New(nil), nil)
	if err != nil {
		b.Fatal(err)
	}
	f, err := idem.Wrap(g, bare, &idem.FuncConfig[charge, receipt]{Key: byOrder})
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := f.Call(context.Background(), charge{OrderID: "o1", Cents: 5}); err != nil {
		b.Fatal(err)
	}
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, replayed, err := f.Call(context.Background(), charge{OrderID: "o1", Cents: 5}); err != nil || !replayed {
				b.Fatal(replayed, err)
			}
		}
	})
	// The untyped Guard.Do replaying the same record with a fingerprint
	// computed once: what Func adds is the input's fingerprint (JSON and
	// SHA-256) and the result's decoding.
	fp, err := idem.JSONFingerprint(charge{OrderID: "o1", Cents: 5})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("guard-do-replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, replayed, err := g.Do(context.Background(), "shop", "charge:o1", fp, nil); err != nil || !replayed {
				b.Fatal(replayed, err)
			}
		}
	})
	var n atomic.Int64
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			id := strconv.FormatInt(n.Add(1), 10)
			if _, replayed, err := f.Call(context.Background(), charge{OrderID: id, Cents: 5}); err != nil || replayed {
				b.Fatal(replayed, err)
			}
		}
	})
}
