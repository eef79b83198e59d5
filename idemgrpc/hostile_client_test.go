package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/idemgrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestClientRetryInfoBeyondMax: a RetryInfo that asks for a longer wait
// than MaxRetryDelay (an hour here, a server's bug or a proxy's) is not
// waited for, even by a call without a deadline: the call returns that
// answer after one attempt.
func TestClientRetryInfoBeyondMax(t *testing.T) {
	t.Parallel()
	st, err := status.New(codes.Aborted, "come back in an hour").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	client := newClient(t, &idemgrpc.ClientConfig{BaseDelay: time.Millisecond})
	s, conn := setup(t, nil, failing(100, st.Err()), client.Unary)
	ctx, cancel := context.WithCancel(context.Background()) // no deadline
	defer cancel()
	done := make(chan call, 1)
	go func() { done <- create(withKey(ctx, "hour-1"), conn, item("pen")) }()
	var c call
	select {
	case c = <-done:
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("the client waits out a RetryInfo of an hour")
	}
	if status.Code(c.err) != codes.Aborted || retryInfo(c.err) != time.Hour {
		t.Fatalf("call: %v, want the server's Aborted with its RetryInfo", c.err)
	}
	if n := len(s.seenKeys()); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}

	// Within the bound it is waited for.
	client = newClient(t, &idemgrpc.ClientConfig{BaseDelay: time.Millisecond, MaxRetryDelay: time.Hour})
	st, _ = status.New(codes.Aborted, "soon").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(10 * time.Millisecond)})
	s, conn = setup(t, nil, failing(1, st.Err()), client.Unary)
	if c := create(context.Background(), conn, item("pen")); c.err != nil || s.calls.Load() != 2 {
		t.Fatalf("call: %v after %d runs, want the second run's answer", c.err, s.calls.Load())
	}
}

// TestClientDoesNotRetryReplays: an answer marked idempotency-replayed is
// the key's stored answer; a retry would get it again, so the client
// returns it even when its code is one it retries (a server whose Release
// policy stores DeadlineExceeded; Unavailable, a "try again", is never
// stored).
func TestClientDoesNotRetryReplays(t *testing.T) {
	t.Parallel()
	client := newClient(t, &idemgrpc.ClientConfig{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	s, conn := setup(t, &idemgrpc.Config{Release: func(c codes.Code) bool { return c == codes.Internal }},
		failing(100, status.Error(codes.DeadlineExceeded, "kept")), client.Unary)
	ctx := withKey(context.Background(), "stored-deadline")
	// The first attempt runs the handler; its DeadlineExceeded (stored, not a
	// replay) is retried once, and that retry is the replay.
	if c := create(ctx, conn, item("pen")); status.Code(c.err) != codes.DeadlineExceeded || !c.replayed {
		t.Fatalf("first call: %v, replayed %v; want the stored DeadlineExceeded, replayed", c.err, c.replayed)
	}
	if n := len(s.seenKeys()); n != 2 {
		t.Fatalf("first call: %d attempts, want 2 (the run, then one replay)", n)
	}
	if c := create(ctx, conn, item("pen")); status.Code(c.err) != codes.DeadlineExceeded || !c.replayed {
		t.Fatalf("second call: %v, replayed %v", c.err, c.replayed)
	}
	if n := len(s.seenKeys()); n != 3 {
		t.Fatalf("after the second call: %d attempts, want 3 (a replay is not retried)", n)
	}
	if s.calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", s.calls.Load())
	}
}
