package idemgrpc_test

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// benchRequest is a small order: a few fields, one nested list.
func benchRequest() *structpb.Struct {
	s, err := structpb.NewStruct(map[string]any{
		"sku": "BOOK-1", "quantity": 2, "coupon": "WELCOME10",
		"address": map[string]any{"street": "1 Main St", "city": "Springfield", "zip": "12345"},
		"notes":   []any{"gift wrap", "leave at the door"},
	})
	if err != nil {
		panic(err)
	}
	return s
}

// benchServer serves the test service over TCP on 127.0.0.1, guarded by
// icpt when it is not nil, with a handler that only builds its answer.
func benchServer(b *testing.B, icpt *idemgrpc.Interceptor) *grpc.ClientConn {
	b.Helper()
	s := &testServer{answers: map[codes.Code]int{}}
	var opts []grpc.ServerOption
	if icpt != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(icpt.Unary))
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&ordersDesc, s)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(lis)
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// BenchmarkVsBareCall: a Create call over TCP (loopback) to a server
// guarded by the interceptor over memstore, a first call (new key) and a
// replay, next to the same call to an unguarded server, interleaved in
// one loop (internal/benchpair).
func BenchmarkVsBareCall(b *testing.B) {
	icpt, err := idemgrpc.New(&idemgrpc.Config{Store: memstore.New(nil)})
	if err != nil {
		b.Fatal(err)
	}
	bare, guarded := benchServer(b, nil), benchServer(b, icpt)
	req := benchRequest()
	invoke := func(ctx context.Context, conn *grpc.ClientConn) {
		if err := conn.Invoke(ctx, methodCreate, req, new(structpb.Struct)); err != nil {
			b.Fatal(err)
		}
	}
	replayCtx := withKey(context.Background(), "replay")
	invoke(replayCtx, guarded)
	var firstCtx context.Context
	n := 0
	means := benchpair.Run(b,
		benchpair.Func{Name: "bare", F: func() { invoke(context.Background(), bare) }},
		benchpair.Func{Name: "first", F: func() { invoke(firstCtx, guarded) }, Before: func() {
			n++
			firstCtx = withKey(context.Background(), "first-"+strconv.Itoa(n))
		}},
		benchpair.Func{Name: "replay", F: func() { invoke(replayCtx, guarded) }},
	)
	benchpair.Ratio(b, "x-bare-first", means[1], means[0])
	benchpair.Ratio(b, "x-bare-replay", means[2], means[0])
}

// BenchmarkInterceptor: the interceptor's own cost, in process (no
// network, no codec), over memstore: Unary around a handler that returns
// a ready answer, for a first call and a replay, next to calling the
// handler alone.
func BenchmarkInterceptor(b *testing.B) {
	icpt, err := idemgrpc.New(&idemgrpc.Config{Store: memstore.New(nil)})
	if err != nil {
		b.Fatal(err)
	}
	req := benchRequest()
	answer := order(1, req)
	handler := func(ctx context.Context, req any) (any, error) { return answer, nil }
	info := &grpc.UnaryServerInfo{FullMethod: methodCreate}
	// The context a server gives a handler has the call's stream, where a
	// replay sets its header.
	serverCtx := grpc.NewContextWithServerTransportStream(context.Background(), nopStream{})
	replayCtx := incomingWithKey(serverCtx, "replay")
	if _, err := icpt.Unary(replayCtx, req, info, handler); err != nil {
		b.Fatal(err)
	}
	var firstCtx context.Context
	n := 0
	call := func(ctx context.Context) {
		if _, err := icpt.Unary(ctx, req, info, handler); err != nil {
			b.Fatal(err)
		}
	}
	benchpair.Run(b,
		benchpair.Func{Name: "handler", F: func() {
			if _, err := handler(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{Name: "first", F: func() { call(firstCtx) }, Before: func() {
			n++
			firstCtx = incomingWithKey(serverCtx, "first-"+strconv.Itoa(n))
		}},
		benchpair.Func{Name: "replay", F: func() { call(replayCtx) }},
	)
}

// nopStream is a grpc.ServerTransportStream that drops what it is given.
type nopStream struct{}

func (nopStream) Method() string                  { return methodCreate }
func (nopStream) SetHeader(md metadata.MD) error  { return nil }
func (nopStream) SendHeader(md metadata.MD) error { return nil }
func (nopStream) SetTrailer(md metadata.MD) error { return nil }
