package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/memstore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestConcurrentDuplicates: 60 callers send one call with one key over
// TCP at once, each through the retrying client interceptor. The handler
// runs once, and holds its key until every other caller has been answered
// Aborted (in flight) at least once; then every caller ends with the same
// answer, all but one of them replayed.
func TestConcurrentDuplicates(t *testing.T) {
	const n = 60
	others := make(chan struct{})
	var once sync.Once
	client, err := idemgrpc.NewClient(&idemgrpc.ClientConfig{MaxAttempts: 10000})
	if err != nil {
		t.Fatal(err)
	}
	s, conn := setup(t, &idemgrpc.Config{RetryDelay: 2 * time.Millisecond}, func(s *testServer) {
		s.onCode = func(c codes.Code) {
			if c == codes.Aborted && s.answered(codes.Aborted) >= n-1 {
				once.Do(func() { close(others) })
			}
		}
		s.handle = func(ctx context.Context, req *structpb.Struct, k int64) (*structpb.Struct, error) {
			select {
			case <-others:
			case <-time.After(20 * time.Second):
				t.Error("the other callers were not all answered Aborted while the first ran")
			}
			return order(k, req), nil
		}
	}, client.Unary)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = withKey(ctx, "dup-1")
	start := make(chan struct{})
	calls := make([]call, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			<-start
			calls[g] = create(ctx, conn, item("book"))
		})
	}
	close(start)
	wg.Wait()

	if got := s.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	want := order(1, item("book"))
	replayed := 0
	for g, c := range calls {
		if c.err != nil {
			t.Fatalf("caller %d: %v", g, c.err)
		}
		if !proto.Equal(c.reply, want) {
			t.Errorf("caller %d got %v, want %v", g, c.reply, want)
		}
		if c.replayed {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d callers got a replay, want %d", replayed, n-1)
	}
	if got := s.answered(codes.Aborted); got < n-1 {
		t.Errorf("server answered Aborted %d times, want at least %d", got, n-1)
	}
	if got := s.answered(codes.OK); got != n {
		t.Errorf("server answered OK %d times, want %d", got, n)
	}
	for _, k := range s.seenKeys() {
		if k != "dup-1" {
			t.Fatalf("server saw key %q, want dup-1 on every attempt", k)
		}
	}
}

// TestReplay: a retry gets the first answer, marked replayed, without
// running the handler; another key runs it again.
func TestReplay(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, nil, nil)
	ctx := withKey(context.Background(), "replay-1")
	first := create(ctx, conn, item("pen"))
	if first.err != nil || first.replayed {
		t.Fatalf("first call: %v, replayed %v", first.err, first.replayed)
	}
	second := create(ctx, conn, item("pen"))
	if second.err != nil {
		t.Fatal(second.err)
	}
	if !second.replayed {
		t.Error("the retry's header has no idempotency-replayed: true")
	}
	if !proto.Equal(first.reply, second.reply) {
		t.Errorf("retry got %v, first %v", second.reply, first.reply)
	}
	if got := s.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	third := create(withKey(context.Background(), "replay-2"), conn, item("pen"))
	if third.err != nil || third.replayed || s.calls.Load() != 2 {
		t.Fatalf("another key: %v, replayed %v, handler runs %d (want 2)", third.err, third.replayed, s.calls.Load())
	}
	if !proto.Equal(third.reply, order(2, item("pen"))) {
		t.Errorf("another key got %v", third.reply)
	}
}

// TestMismatch: the same key with another request, or for another
// method, is refused FailedPrecondition IDEMPOTENCY_KEY_REUSED without
// running a handler; the first request still replays afterwards.
func TestMismatch(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, nil, nil)
	ctx := withKey(context.Background(), "mismatch-1")
	if c := create(ctx, conn, item("pen")); c.err != nil {
		t.Fatal(c.err)
	}
	other := create(ctx, conn, item("ink"))
	if status.Code(other.err) != codes.FailedPrecondition || errorInfo(other.err) != idemgrpc.ReasonKeyReused {
		t.Fatalf("another request under the key: %v (reason %q), want FailedPrecondition %s",
			other.err, errorInfo(other.err), idemgrpc.ReasonKeyReused)
	}
	// The same key on Echo: another method is another request.
	err := conn.Invoke(ctx, methodEcho, wrapperspb.String("pen"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.FailedPrecondition || errorInfo(err) != idemgrpc.ReasonKeyReused {
		t.Fatalf("the key on another method: %v", err)
	}
	if s.calls.Load() != 1 || s.echoes.Load() != 0 {
		t.Fatalf("handlers ran: Create %d (want 1), Echo %d (want 0)", s.calls.Load(), s.echoes.Load())
	}
	again := create(ctx, conn, item("pen"))
	if again.err != nil || !again.replayed || !proto.Equal(again.reply, order(1, item("pen"))) {
		t.Fatalf("the first request after a mismatch: %v, replayed %v, %v", again.err, again.replayed, again.reply)
	}
}

// TestInFlight: a call while the first with its key runs is answered
// Aborted with a RetryInfo of Config.RetryDelay; once the first ends, the
// retry replays.
func TestInFlight(t *testing.T) {
	t.Parallel()
	entered, proceed := make(chan struct{}), make(chan struct{})
	s, conn := setup(t, &idemgrpc.Config{RetryDelay: 1500 * time.Millisecond}, func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			close(entered)
			<-proceed
			return order(n, req), nil
		}
	})
	ctx := withKey(context.Background(), "inflight-1")
	firstDone := make(chan call, 1)
	go func() { firstDone <- create(ctx, conn, item("pen")) }()
	<-entered
	dup := create(ctx, conn, item("pen"))
	close(proceed)
	if status.Code(dup.err) != codes.Aborted || errorInfo(dup.err) != idemgrpc.ReasonInFlight {
		t.Fatalf("duplicate in flight: %v (reason %q), want Aborted %s", dup.err, errorInfo(dup.err), idemgrpc.ReasonInFlight)
	}
	if d := retryInfo(dup.err); d != 1500*time.Millisecond {
		t.Errorf("RetryInfo delay %v, want 1.5s", d)
	}
	if first := <-firstDone; first.err != nil {
		t.Fatal(first.err)
	}
	if c := create(ctx, conn, item("pen")); c.err != nil || !c.replayed || s.calls.Load() != 1 {
		t.Fatalf("retry after the first ended: %v, replayed %v, handler runs %d", c.err, c.replayed, s.calls.Load())
	}
}

// TestDefiniteErrorReplayed: a handler's definite failure is stored with
// its message and details and replayed, marked; the handler runs once.
func TestDefiniteErrorReplayed(t *testing.T) {
	t.Parallel()
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.AlreadyExists,
		codes.FailedPrecondition, codes.OutOfRange} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			s, conn := setup(t, nil, func(s *testServer) {
				s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
					st, err := status.New(code, fmt.Sprintf("refused, run %d", n)).WithDetails(
						&errdetails.ResourceInfo{ResourceType: "item", ResourceName: "pen", Description: "out of stock"})
					if err != nil {
						return nil, err
					}
					return nil, st.Err()
				}
			})
			ctx := withKey(context.Background(), "definite-"+code.String())
			first := create(ctx, conn, item("pen"))
			second := create(ctx, conn, item("pen"))
			if s.calls.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", s.calls.Load())
			}
			if first.replayed || !second.replayed {
				t.Errorf("replayed marks: first %v (want false), second %v (want true)", first.replayed, second.replayed)
			}
			for i, c := range []call{first, second} {
				st := status.Convert(c.err)
				if st.Code() != code || st.Message() != "refused, run 1" {
					t.Fatalf("call %d: %v, want %v \"refused, run 1\"", i+1, c.err, code)
				}
				details := st.Details()
				ri, ok := details[0].(*errdetails.ResourceInfo)
				if len(details) != 1 || !ok || ri.GetDescription() != "out of stock" {
					t.Errorf("call %d: details %v, want the handler's ResourceInfo", i+1, details)
				}
			}
		})
	}
}

// TestTransientErrorReleases: a handler's transient failure releases the
// key, so the retry runs the handler again and its success is stored.
func TestTransientErrorReleases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Unavailable", status.Error(codes.Unavailable, "downstream down")},
		{"DeadlineExceeded", status.Error(codes.DeadlineExceeded, "downstream slow")},
		{"ResourceExhausted", status.Error(codes.ResourceExhausted, "quota")},
		{"Aborted", status.Error(codes.Aborted, "transaction conflict")},
		{"Internal", status.Error(codes.Internal, "bug")},
		{"Unknown", status.Error(codes.Unknown, "?")},
		{"Canceled", status.Error(codes.Canceled, "gave up")},
		{"plain error", errors.New("not a status")},
		{"wrapped status", fmt.Errorf("charge: %w", status.Error(codes.Unavailable, "provider down"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, conn := setup(t, nil, func(s *testServer) {
				s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
					if n == 1 {
						return nil, tc.err
					}
					return order(n, req), nil
				}
			})
			ctx := withKey(context.Background(), "transient")
			first := create(ctx, conn, item("pen"))
			if status.Code(first.err) != status.Code(tc.err) && !(tc.name == "plain error" && status.Code(first.err) == codes.Unknown) {
				t.Fatalf("first call: %v, want the handler's %v", first.err, tc.err)
			}
			if _, err := s.store.Get(context.Background(), "", "transient"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("record after a transient failure: %v, want released (ErrNotFound)", err)
			}
			second := create(ctx, conn, item("pen"))
			if second.err != nil || second.replayed || !proto.Equal(second.reply, order(2, item("pen"))) {
				t.Fatalf("retry: %v, replayed %v, %v; want the handler's second run", second.err, second.replayed, second.reply)
			}
			third := create(ctx, conn, item("pen"))
			if third.err != nil || !third.replayed || s.calls.Load() != 2 {
				t.Fatalf("third call: %v, replayed %v, handler runs %d (want 2)", third.err, third.replayed, s.calls.Load())
			}
		})
	}
}

// TestReleasePolicy: Config.Release decides; here Internal is stored.
func TestReleasePolicy(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, &idemgrpc.Config{Release: func(c codes.Code) bool { return c == codes.Unknown }}, func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			return nil, status.Error(codes.Internal, "kept")
		}
	})
	ctx := withKey(context.Background(), "policy")
	create(ctx, conn, item("pen"))
	c := create(ctx, conn, item("pen"))
	if status.Code(c.err) != codes.Internal || !c.replayed || s.calls.Load() != 1 {
		t.Fatalf("second call: %v, replayed %v, handler runs %d; want the stored Internal", c.err, c.replayed, s.calls.Load())
	}
}

// TestAuthErrorReleases: Unauthenticated and PermissionDenied refuse the
// caller's credentials, not the request: by default they release the key,
// and the retry with a refreshed token runs the handler, where a replay
// would repeat the stale refusal.
func TestAuthErrorReleases(t *testing.T) {
	t.Parallel()
	for _, code := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			var effects atomic.Int64
			s, conn := setup(t, nil, func(s *testServer) {
				s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
					md, _ := metadata.FromIncomingContext(ctx)
					if tok := md.Get("authorization"); len(tok) != 1 || tok[0] != "Bearer fresh" {
						return nil, status.Error(code, "token expired")
					}
					return order(effects.Add(1), req), nil
				}
			})
			ctx := withKey(context.Background(), "auth-"+code.String())
			if first := create(ctx, conn, item("pen")); status.Code(first.err) != code {
				t.Fatalf("first call: %v, want %v", first.err, code)
			}
			fresh := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer fresh")
			second := create(fresh, conn, item("pen"))
			if second.err != nil || second.replayed {
				t.Fatalf("retry with a fresh token: %v, replayed %v; want the handler's answer", second.err, second.replayed)
			}
			third := create(fresh, conn, item("pen"))
			if third.err != nil || !third.replayed || !proto.Equal(third.reply, second.reply) {
				t.Fatalf("third call: %v, replayed %v; want the second's answer replayed", third.err, third.replayed)
			}
			if s.calls.Load() != 2 || effects.Load() != 1 {
				t.Fatalf("handler ran %d times with %d effects; want 2 and 1", s.calls.Load(), effects.Load())
			}
		})
	}
}

// TestTryAgainNeverStored: an answer that tells the client to try again
// (Unavailable, ResourceExhausted, Aborted, any status with a RetryInfo)
// releases the key even under a policy that keeps every code; a definite
// answer without RetryInfo is stored under it.
func TestTryAgainNeverStored(t *testing.T) {
	t.Parallel()
	withRetryInfo := func(c codes.Code) error {
		st, err := status.New(c, "later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, tc := range []struct {
		name   string
		err    error
		stored bool
	}{
		{"Unavailable", status.Error(codes.Unavailable, "down"), false},
		{"ResourceExhausted", status.Error(codes.ResourceExhausted, "quota"), false},
		{"Aborted", status.Error(codes.Aborted, "in flight downstream"), false},
		{"FailedPrecondition with RetryInfo", withRetryInfo(codes.FailedPrecondition), false},
		{"Internal with RetryInfo", withRetryInfo(codes.Internal), false},
		{"FailedPrecondition", status.Error(codes.FailedPrecondition, "no"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, conn := setup(t, &idemgrpc.Config{Release: func(codes.Code) bool { return false }}, func(s *testServer) {
				s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
					return nil, tc.err
				}
			})
			ctx := withKey(context.Background(), "try-again")
			first := create(ctx, conn, item("pen"))
			second := create(ctx, conn, item("pen"))
			if status.Code(first.err) != status.Code(tc.err) || status.Code(second.err) != status.Code(tc.err) {
				t.Fatalf("answers %v and %v, want %v", first.err, second.err, tc.err)
			}
			_, err := s.store.Get(context.Background(), "", "try-again")
			if tc.stored {
				if err != nil || !second.replayed || s.calls.Load() != 1 {
					t.Fatalf("record %v, second replayed %v, handler runs %d; want it stored and replayed", err, second.replayed, s.calls.Load())
				}
				return
			}
			if !errors.Is(err, idem.ErrNotFound) || second.replayed || s.calls.Load() != 2 {
				t.Fatalf("record %v, second replayed %v, handler runs %d; want it released and run again", err, second.replayed, s.calls.Load())
			}
		})
	}
}

// TestKeys: a call without a key, with a malformed one, or with two, is
// refused InvalidArgument with its reason and runs nothing; a quoted key
// (RFC 8941, as over HTTP) is its bare form; KeyOptional runs a call
// without a key unguarded.
func TestKeys(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, nil, nil)
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		reason string
	}{
		{"missing", context.Background(), idemgrpc.ReasonMissingKey},
		{"empty", withKey(context.Background(), ""), idemgrpc.ReasonInvalidKey},
		{"too long", withKey(context.Background(), strings.Repeat("k", 256)), idemgrpc.ReasonInvalidKey},
		{"two values", withKey(withKey(context.Background(), "a"), "b"), idemgrpc.ReasonInvalidKey},
	} {
		c := create(tc.ctx, conn, item("pen"))
		if status.Code(c.err) != codes.InvalidArgument || errorInfo(c.err) != tc.reason {
			t.Errorf("%s: %v (reason %q), want InvalidArgument %s", tc.name, c.err, errorInfo(c.err), tc.reason)
		}
	}
	// gRPC clients refuse to send control characters: the server sees
	// one only from a client of its own.
	_, err := s.icpt.Unary(incomingWithKey(context.Background(), "a\x7fb"), item("pen"),
		&grpc.UnaryServerInfo{FullMethod: methodCreate}, func(ctx context.Context, req any) (any, error) {
			s.calls.Add(1)
			return item("x"), nil
		})
	if status.Code(err) != codes.InvalidArgument || errorInfo(err) != idemgrpc.ReasonInvalidKey {
		t.Errorf("control character: %v, want InvalidArgument %s", err, idemgrpc.ReasonInvalidKey)
	}
	if s.calls.Load() != 0 {
		t.Fatalf("handler ran %d times for refused calls", s.calls.Load())
	}
	if c := create(withKey(context.Background(), "q-1"), conn, item("pen")); c.err != nil {
		t.Fatal(c.err)
	}
	if c := create(withKey(context.Background(), `"q-1"`), conn, item("pen")); c.err != nil || !c.replayed || s.calls.Load() != 1 {
		t.Fatalf("quoted key: %v, replayed %v, handler runs %d", c.err, c.replayed, s.calls.Load())
	}

	opt, optConn := setup(t, &idemgrpc.Config{KeyOptional: true}, nil)
	for range 2 {
		if c := create(context.Background(), optConn, item("pen")); c.err != nil || c.replayed {
			t.Fatalf("KeyOptional without a key: %v, replayed %v", c.err, c.replayed)
		}
	}
	if opt.calls.Load() != 2 {
		t.Fatalf("KeyOptional: handler ran %d times for 2 calls without a key, want 2", opt.calls.Load())
	}
}

// TestCovers: a method Covers leaves out passes through without a key
// and is never recorded.
func TestCovers(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, &idemgrpc.Config{Covers: idemgrpc.MethodsIn(methodCreate)}, nil)
	for range 2 {
		reply := new(wrapperspb.StringValue)
		if err := conn.Invoke(context.Background(), methodEcho, wrapperspb.String("x"), reply); err != nil || reply.GetValue() != "echo x" {
			t.Fatalf("uncovered Echo: %v, %v", err, reply)
		}
	}
	if s.echoes.Load() != 2 {
		t.Fatalf("Echo ran %d times, want 2", s.echoes.Load())
	}
	if c := create(context.Background(), conn, item("pen")); status.Code(c.err) != codes.InvalidArgument {
		t.Fatalf("covered Create without a key: %v", c.err)
	}
	if !idemgrpc.MethodsIn("/a.B/")("/a.B/C") || idemgrpc.MethodsIn("/a.B/")("/a.BC/D") || idemgrpc.MethodsIn("/a.B/C")("/a.B/CD") {
		t.Error("MethodsIn matches wrongly")
	}
}

// TestScope: one key in two scopes runs twice; a Scope error answers
// Unauthenticated, or its own status; an invalid scope InvalidArgument.
func TestScope(t *testing.T) {
	t.Parallel()
	scope := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		switch key := strings.Join(md.Get(idemgrpc.MetadataKey), ","); {
		case strings.HasPrefix(key, "anon"):
			return "", errors.New("no credentials")
		case strings.HasPrefix(key, "denied"):
			return "", status.Error(codes.PermissionDenied, "banned")
		case strings.HasPrefix(key, "bad"):
			return "a\x00b", nil
		}
		return "tenant-" + strings.Join(md.Get("tenant"), ","), nil
	}
	s, conn := setup(t, &idemgrpc.Config{Scope: scope}, nil)
	a := create(metadata.AppendToOutgoingContext(withKey(context.Background(), "k"), "tenant", "a"), conn, item("pen"))
	b := create(metadata.AppendToOutgoingContext(withKey(context.Background(), "k"), "tenant", "b"), conn, item("pen"))
	if a.err != nil || b.err != nil || a.replayed || b.replayed || s.calls.Load() != 2 {
		t.Fatalf("one key in two scopes: %v, %v, replayed %v %v, handler runs %d (want 2)", a.err, b.err, a.replayed, b.replayed, s.calls.Load())
	}
	for key, want := range map[string]codes.Code{"anon-1": codes.Unauthenticated, "denied-1": codes.PermissionDenied, "bad-1": codes.InvalidArgument} {
		if c := create(withKey(context.Background(), key), conn, item("pen")); status.Code(c.err) != want {
			t.Errorf("key %s: %v, want %v", key, c.err, want)
		}
	}
	if s.calls.Load() != 2 {
		t.Fatalf("handler ran for refused callers: %d runs", s.calls.Load())
	}
}

// TestStoreUnavailable: a store that cannot acquire answers Unavailable
// with a RetryInfo, and runs nothing; with FailOpen the handler runs
// unguarded. A store that cannot complete still lets the caller have the
// handler's answer, and leaves the key in flight to its lease.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	fs := &flakyStore{Store: memstore.New(nil)}
	s, conn := setup(t, &idemgrpc.Config{Store: fs, RetryDelay: 3 * time.Second}, nil)
	fs.acquire.Store(true)
	c := create(withKey(context.Background(), "down-1"), conn, item("pen"))
	if status.Code(c.err) != codes.Unavailable || errorInfo(c.err) != idemgrpc.ReasonStoreUnavailable || retryInfo(c.err) != 3*time.Second {
		t.Fatalf("store down: %v (reason %q, retry %v), want Unavailable %s with RetryInfo 3s",
			c.err, errorInfo(c.err), retryInfo(c.err), idemgrpc.ReasonStoreUnavailable)
	}
	if s.calls.Load() != 0 {
		t.Fatal("handler ran with the store down")
	}

	fs.acquire.Store(false)
	fs.complete.Store(true)
	c = create(withKey(context.Background(), "down-2"), conn, item("pen"))
	if c.err != nil || !proto.Equal(c.reply, order(1, item("pen"))) {
		t.Fatalf("completion failed: the caller got %v, %v; want the handler's answer", c.err, c.reply)
	}
	rec, err := fs.Get(context.Background(), "", "down-2")
	if err != nil || rec.Status != idem.StatusProcessing {
		t.Fatalf("record after a failed completion: %+v, %v; want processing (left to its lease)", rec, err)
	}
	if c := create(withKey(context.Background(), "down-2"), conn, item("pen")); status.Code(c.err) != codes.Aborted || s.calls.Load() != 1 {
		t.Fatalf("retry within the lease: %v, handler runs %d; want Aborted and 1", c.err, s.calls.Load())
	}

	ofs := &flakyStore{Store: memstore.New(nil)}
	ofs.acquire.Store(true)
	open, openConn := setup(t, &idemgrpc.Config{Store: ofs, FailOpen: true}, nil)
	if c := create(withKey(context.Background(), "down-3"), openConn, item("pen")); c.err != nil || open.calls.Load() != 1 {
		t.Fatalf("FailOpen: %v, handler runs %d", c.err, open.calls.Load())
	}
}

// TestPanicReleases: a handler that panics releases its key, and the
// panic goes on.
func TestPanicReleases(t *testing.T) {
	t.Parallel()
	store := memstore.New(nil)
	icpt, err := idemgrpc.New(&idemgrpc.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := incomingWithKey(context.Background(), "panic-1")
	info := &grpc.UnaryServerInfo{FullMethod: methodCreate}
	func() {
		defer func() {
			if recover() != "boom" {
				t.Error("the handler's panic did not go on")
			}
		}()
		_, _ = icpt.Unary(ctx, item("pen"), info, func(ctx context.Context, req any) (any, error) { panic("boom") })
	}()
	if _, err := store.Get(context.Background(), "", "panic-1"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record after a panic: %v, want released", err)
	}
	resp, err := icpt.Unary(ctx, item("pen"), info, func(ctx context.Context, req any) (any, error) { return order(7, item("pen")), nil })
	if err != nil || !proto.Equal(resp.(proto.Message), order(7, item("pen"))) {
		t.Fatalf("retry after the panic: %v, %v", resp, err)
	}
}

// TestCompleteTxInHandler: a handler that completes its execution itself
// (as it would in its SQL transaction) with EncodeMessage has that answer
// replayed.
func TestHandlerCompletes(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, nil, func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			resp := order(n, req)
			stored, err := idemgrpc.EncodeMessage(resp)
			if err != nil {
				return nil, err
			}
			if err := idem.FromContext(ctx).Complete(ctx, stored); err != nil {
				return nil, err
			}
			return resp, nil
		}
	})
	ctx := withKey(context.Background(), "self-1")
	first, second := create(ctx, conn, item("pen")), create(ctx, conn, item("pen"))
	if first.err != nil || second.err != nil || !second.replayed || !proto.Equal(first.reply, second.reply) || s.calls.Load() != 1 {
		t.Fatalf("self-completed: %v %v, replayed %v, %v vs %v, handler runs %d",
			first.err, second.err, second.replayed, first.reply, second.reply, s.calls.Load())
	}
}

// TestUnknownStoredType: a record whose message type this server does
// not know is answered Internal IDEMPOTENCY_RECORD_UNREADABLE, never run
// again.
func TestUnknownStoredType(t *testing.T) {
	t.Parallel()
	store := memstore.New(nil)
	icpt, err := idemgrpc.New(&idemgrpc.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := incomingWithKey(context.Background(), "unknown-1")
	info := &grpc.UnaryServerInfo{FullMethod: methodCreate}
	fp, _ := idemgrpc.FingerprintV1(methodCreate, item("pen"))
	g, _ := idem.NewGuard(store, nil)
	if _, _, err := g.Do(context.Background(), "", "unknown-1", fp, func(context.Context) (idem.Response, error) {
		return idem.Response{Header: map[string][]string{"Grpc-Message-Type": {"no.such.Type"}}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = icpt.Unary(ctx, item("pen"), info, func(ctx context.Context, req any) (any, error) { ran = true; return item("x"), nil })
	if status.Code(err) != codes.Internal || errorInfo(err) != idemgrpc.ReasonUnreadable || ran {
		t.Fatalf("unknown stored type: %v (reason %q), handler ran %v", err, errorInfo(err), ran)
	}
}

// TestFingerprintDeterministic: a Struct (a map) with the same content
// built in different insertion orders has one fingerprint, and over gRPC
// the second replays instead of being refused; other content, or another
// method, has another fingerprint.
func TestFingerprintDeterministic(t *testing.T) {
	t.Parallel()
	names := make([]string, 50)
	for i := range names {
		names[i] = fmt.Sprintf("field-%03d", i)
	}
	// build sets the fields (and those of a Struct nested in each) in
	// the order of names, or in reverse.
	build := func(reverse bool) *structpb.Struct {
		order := slices.Clone(names)
		if reverse {
			slices.Reverse(order)
		}
		s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		for _, n := range order {
			nested := &structpb.Struct{Fields: map[string]*structpb.Value{}}
			for _, m := range order {
				nested.Fields[m] = structpb.NewStringValue(n + m)
			}
			s.Fields[n] = structpb.NewStructValue(nested)
		}
		return s
	}
	a, b := build(false), build(true)
	if !proto.Equal(a, b) {
		t.Fatal("the two Structs differ")
	}
	fa, err := idemgrpc.FingerprintV1(methodCreate, a)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if fb, err := idemgrpc.FingerprintV1(methodCreate, b); err != nil || fb != fa {
			t.Fatalf("equal Structs: fingerprints %s and %s (%v)", fa, fb, err)
		}
	}
	if !strings.HasPrefix(string(fa), "g1:") || len(fa) != 3+64 {
		t.Errorf("fingerprint %q, want g1: and 64 hex digits", fa)
	}
	c := build(false)
	c.Fields["field-000"] = structpb.NewStringValue("changed")
	if fc, _ := idemgrpc.FingerprintV1(methodCreate, c); fc == fa {
		t.Error("different content, same fingerprint")
	}
	if fm, _ := idemgrpc.FingerprintV1(methodEcho, a); fm == fa {
		t.Error("different method, same fingerprint")
	}
	if _, err := idemgrpc.FingerprintV1(methodCreate, "not a message"); err == nil {
		t.Error("a non-proto request was fingerprinted")
	}

	s, conn := setup(t, nil, nil)
	ctx := withKey(context.Background(), "det-1")
	if c := create(ctx, conn, a); c.err != nil {
		t.Fatal(c.err)
	}
	if c := create(ctx, conn, b); c.err != nil || !c.replayed || s.calls.Load() != 1 {
		t.Fatalf("the same Struct built in another order: %v, replayed %v, handler runs %d", c.err, c.replayed, s.calls.Load())
	}
}

// TestNew refuses what it must.
func TestNew(t *testing.T) {
	t.Parallel()
	if _, err := idemgrpc.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := idemgrpc.New(&idemgrpc.Config{}); err == nil {
		t.Error("New without a Store succeeded")
	}
	if _, err := idemgrpc.New(&idemgrpc.Config{Store: memstore.New(nil), RetryDelay: -1}); err == nil {
		t.Error("New with a negative RetryDelay succeeded")
	}
	if _, err := idemgrpc.New(&idemgrpc.Config{Store: memstore.New(nil), Lease: time.Microsecond}); err == nil {
		t.Error("New with a 1µs lease succeeded")
	}
}

// TestClientDeadlineDoesNotCutHandler: the handler runs detached from the
// caller's context. A client deadline shorter than the handler used to end
// the handler's context after its effect; the handler answered
// DeadlineExceeded, the key was released, and the retry ran the effect
// again. Now the handler runs on (keeping the call's metadata), its answer
// is stored although the caller has gone, and the retry gets it.
func TestClientDeadlineDoesNotCutHandler(t *testing.T) {
	t.Parallel()
	var effects atomic.Int64
	proceed := make(chan struct{})
	ended := make(chan error, 1)
	caller := make(chan context.Context, 1)
	s, conn := setup(t, nil, func(s *testServer) {
		s.onCall = func(ctx context.Context) {
			select {
			case caller <- ctx: // the first call's, as the server sees it
			default:
			}
		}
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(idemgrpc.MetadataKey)) != 1 {
				return nil, status.Error(codes.InvalidArgument, "the handler's context lost the call's metadata")
			}
			effects.Add(1) // the effect, then work that heeds ctx
			if n > 1 {
				return order(n, req), nil
			}
			select {
			case <-proceed:
			case <-ctx.Done():
			}
			if err := ctx.Err(); err != nil {
				ended <- context.Cause(ctx)
				return nil, status.FromContextError(err).Err()
			}
			ended <- nil
			return order(n, req), nil
		}
	})
	ctx, cancel := context.WithTimeout(withKey(context.Background(), "deadline"), 100*time.Millisecond)
	defer cancel()
	if first := create(ctx, conn, item("pen")); status.Code(first.err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want the client's DeadlineExceeded", first.err)
	}
	// Once the call's context has ended on the server too, the handler
	// still runs (on the old code its context ended with it); let it
	// finish.
	select {
	case <-(<-caller).Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the call's context did not end on the server")
	}
	close(proceed)
	if err := <-ended; err != nil {
		t.Errorf("the handler's context ended with the client's deadline: %v", err)
	}
	// The retry gets Aborted while the answer is being stored, then the
	// answer.
	var retry call
	waitFor(t, "the stored answer", func() bool {
		retry = create(withKey(context.Background(), "deadline"), conn, item("pen"))
		return status.Code(retry.err) != codes.Aborted
	})
	if retry.err != nil || !retry.replayed || !proto.Equal(retry.reply, order(1, item("pen"))) {
		t.Fatalf("retry: %v, replayed %v, %v; want the first run's answer replayed", retry.err, retry.replayed, retry.reply)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestHandlerBoundedByMaxExecution: detached from the caller, the handler
// is still bounded: its context ends at MaxExecution.
func TestHandlerBoundedByMaxExecution(t *testing.T) {
	t.Parallel()
	cause := make(chan error, 1)
	_, conn := setup(t, &idemgrpc.Config{MaxExecution: 100 * time.Millisecond}, func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	})
	create(withKey(context.Background(), "bounded"), conn, item("pen"))
	select {
	case err := <-cause:
		if !errors.Is(err, idem.ErrMaxExecution) {
			t.Fatalf("the handler's context ended with %v, want idem.ErrMaxExecution", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context did not end at MaxExecution")
	}
}

// slowAcquireStore is a store whose Acquire waits for gate (or for its
// context to end, when heedCtx) before it runs; entered is closed once an
// Acquire waits.
type slowAcquireStore struct {
	idem.Store
	heedCtx bool
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (s *slowAcquireStore) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	s.once.Do(func() { close(s.entered) })
	done := ctx.Done()
	if !s.heedCtx {
		done = nil
	}
	select {
	case <-s.gate:
	case <-done:
		return idem.AcquireResult{}, ctx.Err()
	}
	return s.Store.Acquire(ctx, req)
}

// TestCallerGoneDuringAcquire: a caller that goes away while its key is
// being acquired gets no record and no run of the handler, and, with
// StoreTimeout off (negative: the caller's context bounds the store
// calls), a store that does not answer holds the call only as long as
// the caller waits. The interceptor used to detach Begin's context too:
// the Acquire ran on after the caller had gone (forever, with
// StoreTimeout off, against a store that does not answer), and the
// handler then ran for nobody.
func TestCallerGoneDuringAcquire(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		storeTimeout time.Duration
	}{
		{"store timeout off", -1},
		{"default store timeout", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &slowAcquireStore{Store: memstore.New(nil), heedCtx: tc.storeTimeout < 0, gate: make(chan struct{}), entered: make(chan struct{})}
			caller := make(chan context.Context, 1)
			answered := make(chan codes.Code, 1)
			s, conn := setup(t, &idemgrpc.Config{Store: store, StoreTimeout: tc.storeTimeout}, func(s *testServer) {
				s.onCall = func(ctx context.Context) { caller <- ctx }
				s.onCode = func(c codes.Code) { answered <- c }
			})
			openGate := sync.OnceFunc(func() { close(store.gate) })
			defer openGate()
			ctx, cancel := context.WithTimeout(withKey(context.Background(), "gone"), 100*time.Millisecond)
			defer cancel()
			if first := create(ctx, conn, item("pen")); status.Code(first.err) != codes.DeadlineExceeded {
				t.Fatalf("call: %v, want the client's DeadlineExceeded", first.err)
			}
			<-store.entered
			select {
			case <-(<-caller).Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the call's context did not end on the server")
			}
			if tc.storeTimeout >= 0 {
				openGate() // the Acquire ends after the caller has gone
			}
			select {
			case <-answered:
			case <-time.After(5 * time.Second):
				t.Fatal("the server still holds the call of a caller gone 5 s ago")
			}
			if n := s.calls.Load(); n != 0 {
				t.Fatalf("the handler ran %d times for a caller that had gone", n)
			}
			if rec, err := store.Get(t.Context(), "", "gone"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("record %+v, %v; want none", rec, err)
			}
		})
	}
}
