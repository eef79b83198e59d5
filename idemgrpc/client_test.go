package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func newClient(t *testing.T, cfg *idemgrpc.ClientConfig) *idemgrpc.Client {
	t.Helper()
	c, err := idemgrpc.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// failing returns a Create behaviour that answers err to its first n runs.
func failing(n int64, err error) func(*testServer) {
	return func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, k int64) (*structpb.Struct, error) {
			if k <= n {
				return nil, err
			}
			return order(k, req), nil
		}
	}
}

// TestClientRetriesWithOneKey: a server that fails the call transiently
// three times (each failure releases the key) gets four attempts with one
// key the client made up; the caller gets the fourth run's answer, which
// the record keeps.
func TestClientRetriesWithOneKey(t *testing.T) {
	t.Parallel()
	client := newClient(t, &idemgrpc.ClientConfig{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond})
	s, conn := setup(t, nil, failing(3, status.Error(codes.Unavailable, "downstream down")), client.Unary)
	c := create(context.Background(), conn, item("pen"))
	if c.err != nil || !proto.Equal(c.reply, order(4, item("pen"))) {
		t.Fatalf("call: %v, %v; want the fourth run's answer", c.err, c.reply)
	}
	keys := s.seenKeys()
	if len(keys) != 4 || s.calls.Load() != 4 {
		t.Fatalf("server saw %d attempts (keys %q) and %d runs, want 4 and 4", len(keys), keys, s.calls.Load())
	}
	for _, k := range keys {
		if k != keys[0] {
			t.Fatalf("keys differ between attempts: %q", keys)
		}
	}
	if len(keys[0]) != 22 {
		t.Errorf("generated key %q, want 22 characters (128 bits, base64url)", keys[0])
	}
	rec, err := s.store.Get(context.Background(), "", keys[0])
	if err != nil || rec.Status != idem.StatusCompleted {
		t.Fatalf("record: %+v, %v; want completed", rec, err)
	}
	// A second call gets a new key: it runs again.
	if c := create(context.Background(), conn, item("pen")); c.err != nil || c.replayed || s.calls.Load() != 5 {
		t.Fatalf("second call: %v, replayed %v, runs %d (want 5)", c.err, c.replayed, s.calls.Load())
	}
	if keys := s.seenKeys(); keys[4] == keys[0] {
		t.Error("the second call reused the first call's key")
	}
}

// TestClientKeepsCallerKey: a key the caller set is sent on every
// attempt, and a retry of a completed call replays.
func TestClientKeepsCallerKey(t *testing.T) {
	t.Parallel()
	client := newClient(t, &idemgrpc.ClientConfig{BaseDelay: time.Millisecond})
	s, conn := setup(t, nil, failing(1, status.Error(codes.ResourceExhausted, "quota")), client.Unary)
	ctx := withKey(context.Background(), "mine-1")
	if c := create(ctx, conn, item("pen")); c.err != nil {
		t.Fatal(c.err)
	}
	if c := create(ctx, conn, item("pen")); c.err != nil || !c.replayed {
		t.Fatalf("again with the caller's key: %v, replayed %v", c.err, c.replayed)
	}
	keys := s.seenKeys()
	if len(keys) != 3 || keys[0] != "mine-1" || keys[1] != "mine-1" || keys[2] != "mine-1" {
		t.Fatalf("server saw keys %q, want mine-1 three times", keys)
	}
	if s.calls.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", s.calls.Load())
	}
}

// TestClientHonoursRetryInfo: the wait before a retry is the answer's
// RetryInfo delay, not the (here far shorter) backoff.
func TestClientHonoursRetryInfo(t *testing.T) {
	t.Parallel()
	const delay = 150 * time.Millisecond
	st, err := status.New(codes.Aborted, "conflict").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	if err != nil {
		t.Fatal(err)
	}
	client := newClient(t, &idemgrpc.ClientConfig{BaseDelay: time.Microsecond, MaxDelay: time.Millisecond})
	s, conn := setup(t, nil, failing(1, st.Err()), client.Unary)
	if c := create(context.Background(), conn, item("pen")); c.err != nil {
		t.Fatal(c.err)
	}
	s.mu.Lock()
	arrived := append([]time.Time(nil), s.arrived...)
	s.mu.Unlock()
	if len(arrived) != 2 {
		t.Fatalf("%d attempts, want 2", len(arrived))
	}
	if gap := arrived[1].Sub(arrived[0]); gap < delay {
		t.Fatalf("retried after %v, before the RetryInfo delay %v", gap, delay)
	}
}

// TestClientStops: at MaxAttempts; on a code it does not retry; when the
// wait would outlast the context's deadline.
func TestClientStops(t *testing.T) {
	t.Parallel()
	t.Run("max attempts", func(t *testing.T) {
		t.Parallel()
		client := newClient(t, &idemgrpc.ClientConfig{MaxAttempts: 3, BaseDelay: time.Millisecond})
		s, conn := setup(t, nil, failing(100, status.Error(codes.Unavailable, "down")), client.Unary)
		if c := create(context.Background(), conn, item("pen")); status.Code(c.err) != codes.Unavailable {
			t.Fatalf("call: %v, want the last Unavailable", c.err)
		}
		if n := len(s.seenKeys()); n != 3 {
			t.Fatalf("%d attempts, want 3", n)
		}
	})
	t.Run("definite", func(t *testing.T) {
		t.Parallel()
		client := newClient(t, &idemgrpc.ClientConfig{BaseDelay: time.Millisecond})
		s, conn := setup(t, nil, failing(100, status.Error(codes.InvalidArgument, "no")), client.Unary)
		if c := create(context.Background(), conn, item("pen")); status.Code(c.err) != codes.InvalidArgument {
			t.Fatalf("call: %v", c.err)
		}
		if n := len(s.seenKeys()); n != 1 {
			t.Fatalf("%d attempts of an InvalidArgument, want 1", n)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		// The server asks for 10 s; the caller has far less.
		client := newClient(t, nil)
		st, _ := status.New(codes.Unavailable, "down").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Second)})
		s, conn := setup(t, nil, failing(100, st.Err()), client.Unary)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if c := create(ctx, conn, item("pen")); status.Code(c.err) != codes.Unavailable {
			t.Fatalf("call: %v, want the server's Unavailable", c.err)
		}
		if ctx.Err() != nil {
			t.Error("the client waited until the deadline instead of returning")
		}
		if n := len(s.seenKeys()); n != 1 {
			t.Fatalf("%d attempts, want 1", n)
		}
	})
	t.Run("uncovered", func(t *testing.T) {
		t.Parallel()
		client := newClient(t, &idemgrpc.ClientConfig{Covers: idemgrpc.MethodsIn(methodCreate), BaseDelay: time.Millisecond})
		s, conn := setup(t, &idemgrpc.Config{Covers: idemgrpc.MethodsIn(methodCreate)}, nil, client.Unary)
		if err := conn.Invoke(context.Background(), methodEcho, wrapperspb.String("x"), new(wrapperspb.StringValue)); err != nil {
			t.Fatal(err)
		}
		if keys := s.seenKeys(); len(keys) != 0 {
			t.Fatalf("an uncovered call was sent keys %q", keys)
		}
	})
}

// TestNewClient refuses what it must.
func TestNewClient(t *testing.T) {
	t.Parallel()
	for _, cfg := range []idemgrpc.ClientConfig{
		{MaxAttempts: -1}, {BaseDelay: -1}, {MaxDelay: -1}, {MaxRetryDelay: -1}, {BaseDelay: time.Second, MaxDelay: time.Millisecond},
	} {
		if _, err := idemgrpc.NewClient(&cfg); err == nil {
			t.Errorf("NewClient(%+v) succeeded", cfg)
		}
	}
	if _, err := idemgrpc.NewClient(nil); err != nil {
		t.Errorf("NewClient(nil): %v", err)
	}
	if a, b := idemgrpc.NewKey(), idemgrpc.NewKey(); a == b || len(a) != 22 {
		t.Errorf("NewKey: %q, %q", a, b)
	}
}
