package idemgrpc_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestClientDeadlineServerCompletes: the caller gives up while the
// handler runs (a handler that completes its effect without looking at
// its context); the call fails, and the retry with the same key replays
// the handler's answer without running it again. The caller gives up
// only once the handler has started: a deadline that passed before the
// key was taken would leave no record, and the retry would rightly run.
func TestClientDeadlineServerCompletes(t *testing.T) {
	t.Parallel()
	started, gone, done := make(chan struct{}), make(chan struct{}), make(chan codes.Code, 2)
	s, conn := setup(t, nil, func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			close(started)
			<-gone // the caller has given up
			return order(n, req), nil
		}
		s.onCode = func(c codes.Code) { done <- c }
	})
	ctx, cancel := context.WithCancel(withKey(context.Background(), "late-1"))
	defer cancel()
	go func() {
		<-started
		cancel()
	}()
	c := create(ctx, conn, item("pen"))
	close(gone)
	if status.Code(c.err) != codes.Canceled {
		t.Fatalf("first call: %v, want Canceled", c.err)
	}
	<-done // the server has finished the first call
	c = create(withKey(context.Background(), "late-1"), conn, item("pen"))
	if c.err != nil || !c.replayed || !proto.Equal(c.reply, order(1, item("pen"))) {
		t.Fatalf("retry: %v, replayed %v, %v; want run 1's answer replayed", c.err, c.replayed, c.reply)
	}
	if s.calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", s.calls.Load())
	}
}

// hangingStore's Acquire blocks until its context ends.
type hangingStore struct{ idem.Store }

func (hangingStore) Acquire(ctx context.Context, _ idem.AcquireRequest) (idem.AcquireResult, error) {
	<-ctx.Done()
	return idem.AcquireResult{}, ctx.Err()
}

// TestHangingStore: a store that does not answer is Unavailable after
// StoreTimeout, even for a caller without a deadline; nothing runs.
func TestHangingStore(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, &idemgrpc.Config{Store: hangingStore{memstore.New(nil)}, StoreTimeout: 200 * time.Millisecond}, nil)
	res := make(chan call, 1)
	go func() { res <- create(withKey(context.Background(), "hang-1"), conn, item("pen")) }()
	select {
	case c := <-res:
		if status.Code(c.err) != codes.Unavailable || errorInfo(c.err) != idemgrpc.ReasonStoreUnavailable {
			t.Fatalf("call: %v, want Unavailable %s", c.err, idemgrpc.ReasonStoreUnavailable)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a hanging store holds the call past StoreTimeout")
	}
	if s.calls.Load() != 0 {
		t.Fatal("the handler ran")
	}
}

// TestResponseAndError: a handler that returns a message and an error
// is answered the error (as gRPC does), stored or released by its code.
func TestResponseAndError(t *testing.T) {
	t.Parallel()
	s, conn := setup(t, nil, func(s *testServer) {
		s.handle = func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error) {
			return order(n, req), status.Error(codes.NotFound, "no such item")
		}
	})
	ctx := withKey(context.Background(), "both-1")
	for i := range 2 {
		if c := create(ctx, conn, item("pen")); status.Code(c.err) != codes.NotFound || c.replayed != (i == 1) {
			t.Fatalf("call %d: %v, replayed %v; want NotFound, replayed on the second", i+1, c.err, c.replayed)
		}
	}
	rec, err := s.store.Get(context.Background(), "", "both-1")
	if err != nil || rec.Status != idem.StatusCompleted || s.calls.Load() != 1 {
		t.Fatalf("record %+v, %v; runs %d", rec, err, s.calls.Load())
	}
}

// TestNilResponse: a handler that returns neither a message nor an error
// (a nil any) has run its effect; the key must not be released for a
// retry to run the effect again: the retry is answered Internal
// IDEMPOTENCY_RECORD_UNREADABLE.
func TestNilResponse(t *testing.T) {
	t.Parallel()
	store := memstore.New(nil)
	icpt, err := idemgrpc.New(&idemgrpc.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	handler := func(ctx context.Context, req any) (any, error) {
		runs.Add(1)
		return nil, nil
	}
	ctx := incomingWithKey(context.Background(), "nil-1")
	info := &grpc.UnaryServerInfo{FullMethod: methodCreate}
	// The first caller gets what the handler returned (over gRPC, the
	// codec refuses to encode nil: Internal).
	if resp, err := icpt.Unary(ctx, item("pen"), info, handler); resp != nil || err != nil {
		t.Fatalf("first call: %v, %v; want the handler's nil, nil", resp, err)
	}
	if _, err := store.Get(context.Background(), "", "nil-1"); errors.Is(err, idem.ErrNotFound) {
		t.Fatal("the key was released: a retry runs the effect again")
	}
	resp, err := icpt.Unary(ctx, item("pen"), info, handler)
	if status.Code(err) != codes.Internal || errorInfo(err) != idemgrpc.ReasonUnreadable {
		t.Fatalf("retry: %v, %v; want Internal %s", resp, err, idemgrpc.ReasonUnreadable)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}
