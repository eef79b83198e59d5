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
