package idemgrpc_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/memstore"
)

// recObserver records every event it is told, and marks the context
// Start returns so that nested operations can be told from top-level ones.
type recObserver struct {
	mu     sync.Mutex
	events []recEvent
}

type recEvent struct {
	idem.Event
	start  bool
	parent idem.Kind // the Kind of the operation whose Start made ctx, 0 if none
}

type parentKey struct{}

func (o *recObserver) Start(ctx context.Context, e idem.Event) context.Context {
	o.add(ctx, e, true)
	return context.WithValue(ctx, parentKey{}, e.Kind)
}

func (o *recObserver) End(ctx context.Context, e idem.Event) { o.add(ctx, e, false) }

func (o *recObserver) add(ctx context.Context, e idem.Event, start bool) {
	p, _ := ctx.Value(parentKey{}).(idem.Kind)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, recEvent{Event: e, start: start, parent: p})
}

// take returns the events recorded and forgets them.
func (o *recObserver) take() []recEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	ev := o.events
	o.events = nil
	return ev
}

// TestObserverOutcomes drives each outcome through a real gRPC server on
// TCP and checks the one KindRequest Start/End pair of each call: its
// route is the full method, its outcome, the key's hash once known, and
// that its store calls are reported as its children.
func TestObserverOutcomes(t *testing.T) {
	t.Parallel()
	obs := &recObserver{}
	fs := &flakyStore{Store: memstore.New(nil)}
	var mode struct {
		sync.Mutex
		loseLease bool
		code      codes.Code
		block     chan struct{}
		blocked   chan struct{}
		handlerP  idem.Kind // the parent Kind of the handler's context
	}
	srv, conn := setup(t, &idemgrpc.Config{Store: fs, Observer: obs, StoreName: "memory",
		Scope: func(context.Context) (string, error) { return "tenant", nil }}, func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			mode.Lock()
			lose, code, block, blocked := mode.loseLease, mode.code, mode.block, mode.blocked
			mode.handlerP, _ = ctx.Value(parentKey{}).(idem.Kind)
			mode.Unlock()
			if lose {
				l := idem.FromContext(ctx).Lease()
				if err := fs.Store.Delete(context.Background(), l.Scope, l.Key); err != nil {
					t.Error(err)
				}
			}
			if block != nil {
				close(blocked)
				<-block
			}
			if code != codes.OK {
				return nil, status.Error(code, "failed")
			}
			return order(n, req), nil
		}
	})
	ctx := context.Background()
	do := func(key, it string) call {
		if key == "" {
			return create(ctx, conn, item(it))
		}
		return create(withKey(ctx, key), conn, item(it))
	}
	check := func(name string, c call, code codes.Code, outcome, key string, storeOps ...string) {
		t.Helper()
		if status.Code(c.err) != code {
			t.Fatalf("%s: %v, want %v", name, c.err, code)
		}
		ev := obs.take()
		var ends []idem.Event
		for _, e := range ev {
			if e.Kind == idem.KindRequest && !e.start {
				ends = append(ends, e.Event)
			}
		}
		if len(ends) != 1 || ends[0].Outcome != outcome || ends[0].Route != methodCreate || ends[0].Store != "memory" {
			t.Fatalf("%s: request ends %+v, want one %s on %s", name, ends, outcome, methodCreate)
		}
		if ends[0].Duration <= 0 {
			t.Errorf("%s: duration %v", name, ends[0].Duration)
		}
		wantHash := ""
		if key != "" {
			wantHash = idem.HashKey("tenant", key)
		}
		if ends[0].KeyHash != wantHash {
			t.Errorf("%s: key hash %q, want %q", name, ends[0].KeyHash, wantHash)
		}
		if ev[0].Kind != idem.KindRequest || !ev[0].start || ev[0].Route != methodCreate {
			t.Errorf("%s: first event %+v, want the call's Start", name, ev[0])
		}
		var ops []string
		for _, e := range ev {
			if e.Kind != idem.KindStore {
				continue
			}
			if e.start {
				if e.parent != idem.KindRequest {
					t.Errorf("%s: store %s started outside the call's context", name, e.Op)
				}
				continue
			}
			ops = append(ops, e.Op)
			if e.parent != idem.KindStore {
				t.Errorf("%s: store %s ended outside the context its Start returned", name, e.Op)
			}
			if e.Store != "memory" || e.KeyHash != wantHash || e.Duration <= 0 {
				t.Errorf("%s: store event %+v", name, e.Event)
			}
		}
		if strings.Join(ops, ",") != strings.Join(storeOps, ",") {
			t.Errorf("%s: store calls %v, want %v", name, ops, storeOps)
		}
	}

	check("executed", do("k1", "a"), codes.OK, idem.OutcomeExecuted, "k1", idem.OpAcquire, idem.OpComplete)
	mode.Lock()
	if mode.handlerP != idem.KindRequest {
		t.Errorf("the handler's context is not the call's Start's (parent %v)", mode.handlerP)
	}
	mode.Unlock()
	c := do("k1", "a")
	if !c.replayed {
		t.Error("second call not replayed")
	}
	check("replayed", c, codes.OK, idem.OutcomeReplayed, "k1", idem.OpAcquire)
	check("mismatch", do("k1", "b"), codes.FailedPrecondition, idem.OutcomeMismatch, "k1", idem.OpAcquire)
	check("missing key", do("", "a"), codes.InvalidArgument, idem.OutcomeMissingKey, "")
	check("invalid key", do(strings.Repeat("k", 256), "a"), codes.InvalidArgument, idem.OutcomeInvalidKey, "")

	mode.Lock()
	mode.code = codes.Unavailable
	mode.Unlock()
	check("released", do("k3", "a"), codes.Unavailable, idem.OutcomeReleased, "k3", idem.OpAcquire, idem.OpRelease)
	mode.Lock()
	mode.code = codes.OK
	mode.loseLease = true
	mode.Unlock()
	check("lease lost", do("k4", "a"), codes.Aborted, idem.OutcomeLeaseLost, "k4", idem.OpAcquire, idem.OpComplete, idem.OpGet)
	mode.Lock()
	mode.loseLease = false
	mode.Unlock()

	fs.acquire.Store(true)
	check("store error", do("k5", "a"), codes.Unavailable, idem.OutcomeStoreError, "k5", idem.OpAcquire)
	fs.acquire.Store(false)

	// In flight: a second call while the first one's handler runs.
	mode.Lock()
	mode.block, mode.blocked = make(chan struct{}), make(chan struct{})
	block, blocked := mode.block, mode.blocked
	mode.Unlock()
	first := make(chan call)
	go func() { first <- do("k6", "a") }()
	<-blocked
	obs.take() // the first call's Start and Acquire
	mode.Lock()
	mode.block = nil
	mode.Unlock()
	check("in flight", do("k6", "a"), codes.Aborted, idem.OutcomeInFlight, "k6", idem.OpAcquire)
	close(block)
	if c := <-first; c.err != nil {
		t.Fatalf("first: %v", c.err)
	}
	ends := 0
	for _, e := range obs.take() {
		if e.Kind == idem.KindRequest && !e.start {
			ends++
			if e.Outcome != idem.OutcomeExecuted {
				t.Errorf("first call: %+v", e.Event)
			}
		}
	}
	if ends != 1 {
		t.Errorf("first call: %d request ends", ends)
	}
	// The handler ran for k1, k3, k4 and k6 only.
	if n := srv.calls.Load(); n != 4 {
		t.Errorf("the handler ran %d times, want 4", n)
	}
}

// TestObserverPassedAndUncovered: a call without a key under KeyOptional
// is reported as passed; a call of a method that is not covered is not
// reported at all.
func TestObserverPassedAndUncovered(t *testing.T) {
	t.Parallel()
	obs := &recObserver{}
	srv, conn := setup(t, &idemgrpc.Config{Observer: obs, KeyOptional: true,
		Covers: idemgrpc.MethodsIn(methodCreate)}, nil)
	ctx := context.Background()
	if c := create(ctx, conn, item("a")); c.err != nil {
		t.Fatal(c.err)
	}
	ev := obs.take()
	if len(ev) != 2 || !ev[0].start || ev[1].Outcome != idem.OutcomePassed || ev[1].Store != idem.DefaultStoreName || ev[1].KeyHash != "" {
		t.Fatalf("passed call: %+v", ev)
	}
	if err := conn.Invoke(withKey(ctx, "e1"), methodEcho, wrapperspb.String("x"), new(wrapperspb.StringValue)); err != nil {
		t.Fatal(err)
	}
	if ev := obs.take(); len(ev) != 0 || srv.echoes.Load() != 1 {
		t.Fatalf("uncovered call reported: %+v (echoes %d)", ev, srv.echoes.Load())
	}
}

// TestLogsHashKeys: by default no log line of the interceptor carries a
// key or a scope, on the executed, replayed, mismatch, lease-lost,
// store-error and handler-failure paths; the lines that concern a key
// carry its hash. With LogKeys they carry both.
func TestLogsHashKeys(t *testing.T) {
	t.Parallel()
	const key, scope = "order-key-Qz81x", "tenant-Wy93v"
	for _, logKeys := range []bool{false, true} {
		var buf obstest.LogBuffer
		fs := &flakyStore{Store: memstore.New(nil)}
		var mu sync.Mutex
		losing := false
		_, conn := setup(t, &idemgrpc.Config{
			Store:   fs,
			Scope:   func(context.Context) (string, error) { return scope, nil },
			Logger:  slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
			LogKeys: logKeys,
		}, func(s *testServer) {
			s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
				mu.Lock()
				l := losing
				mu.Unlock()
				if l {
					lease := idem.FromContext(ctx).Lease()
					if err := fs.Store.Delete(context.Background(), lease.Scope, lease.Key); err != nil {
						t.Error(err)
					}
				}
				return order(n, req), nil
			}
		})
		ctx := context.Background()
		if c := create(withKey(ctx, key), conn, item("a")); c.err != nil {
			t.Fatal(c.err)
		}
		if c := create(withKey(ctx, key), conn, item("a")); c.err != nil || !c.replayed {
			t.Fatalf("replay: %v", c.err)
		}
		if c := create(withKey(ctx, key), conn, item("b")); status.Code(c.err) != codes.FailedPrecondition {
			t.Fatalf("mismatch: %v", c.err)
		}
		mu.Lock()
		losing = true
		mu.Unlock()
		if c := create(withKey(ctx, key+"-lost"), conn, item("a")); status.Code(c.err) != codes.Aborted {
			t.Fatalf("lease lost: %v", c.err)
		}
		mu.Lock()
		losing = false
		mu.Unlock()
		fs.complete.Store(true)
		if c := create(withKey(ctx, key+"-unstored"), conn, item("a")); c.err != nil {
			t.Fatalf("complete failed: %v", c.err)
		}
		fs.complete.Store(false)
		fs.acquire.Store(true)
		if c := create(withKey(ctx, key+"-down"), conn, item("a")); status.Code(c.err) != codes.Unavailable {
			t.Fatalf("store error: %v", c.err)
		}
		fs.acquire.Store(false)
		out := buf.String()
		for _, want := range []string{"idemgrpc: lease lost", "idemgrpc: answer sent but not stored", "idemgrpc: store unavailable",
			`"idem.key_hash":"` + idem.HashKey(scope, key+"-lost") + `"`,
			`"idem.key_hash":"` + idem.HashKey(scope, key+"-unstored") + `"`,
			`"idem.key_hash":"` + idem.HashKey(scope, key+"-down") + `"`} {
			if !strings.Contains(out, want) {
				t.Errorf("LogKeys %v: the log lacks %q:\n%s", logKeys, want, out)
			}
		}
		hasRaw := strings.Contains(out, key) || strings.Contains(out, scope)
		if hasRaw != logKeys {
			t.Errorf("LogKeys %v: raw key or scope in the log: %v\n%s", logKeys, hasRaw, out)
		}
		if logKeys && !strings.Contains(out, `"idem.key":"`+key+`-down"`) {
			t.Errorf("LogKeys: the key is not under idem.key:\n%s", out)
		}
	}
}
