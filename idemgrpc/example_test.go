package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// charges counts the effect of the example's Charge method.
var charges atomic.Int64

// chargeDesc stands in for a generated service description: one unary
// method, Charge, over well-known types.
var chargeDesc = grpc.ServiceDesc{
	ServiceName: "example.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			charge := func(ctx context.Context, req any) (any, error) {
				n := charges.Add(1)
				return wrapperspb.String(fmt.Sprintf("charge %d for %s", n, req.(*wrapperspb.StringValue).GetValue())), nil
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/example.Payments/Charge"}, charge)
		},
	}},
}

// Example guards a gRPC server with the server interceptor, and calls it
// through the client interceptor, which gives the call a key and retries
// it with that key. The second call sends the same key again, as a client
// whose answer was lost would: the charge is replayed, not made again.
func Example() {
	// The server: records in memory here; sqlstore or redisstore in
	// production.
	guard, err := idemgrpc.New(&idemgrpc.Config{
		Store: memstore.New(nil),
		// Scope: the authenticated caller, from the context.
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(guard.Unary))
	srv.RegisterService(&chargeDesc, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	// The client.
	retrying, err := idemgrpc.NewClient(nil)
	if err != nil {
		panic(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(retrying.Unary))
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, "order-1-payment")
	for range 2 {
		var header metadata.MD
		reply := new(wrapperspb.StringValue)
		if err := conn.Invoke(ctx, "/example.Payments/Charge", wrapperspb.String("order 1"), reply, grpc.Header(&header)); err != nil {
			panic(err)
		}
		fmt.Printf("%s (replayed: %v)\n", reply.GetValue(), header.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("charges made:", charges.Load())
	// Output:
	// charge 1 for order 1 (replayed: [])
	// charge 1 for order 1 (replayed: [true])
	// charges made: 1
}
