package idemgrpc_test

import (
	"context"
	"errors"
	"net"
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
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service, registered from a hand-written grpc.ServiceDesc over
// well-known types: Create (Struct → Struct) has an effect, Echo
// (StringValue → StringValue) has one too, counted apart.
const (
	methodCreate = "/idemgrpc.test.Orders/Create"
	methodEcho   = "/idemgrpc.test.Orders/Echo"
)

var ordersDesc = grpc.ServiceDesc{
	ServiceName: "idemgrpc.test.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Create", Handler: createHandler},
		{MethodName: "Echo", Handler: echoHandler},
	},
	Metadata: "idemgrpc_test",
}

func createHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(structpb.Struct)
	if err := dec(in); err != nil {
		return nil, err
	}
	s := srv.(*testServer)
	h := func(ctx context.Context, req any) (any, error) { return s.create(ctx, req.(*structpb.Struct)) }
	if interceptor == nil {
		return h(ctx, in)
	}
	return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodCreate}, h)
}

func echoHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(wrapperspb.StringValue)
	if err := dec(in); err != nil {
		return nil, err
	}
	s := srv.(*testServer)
	h := func(ctx context.Context, req any) (any, error) {
		s.echoes.Add(1)
		return wrapperspb.String("echo " + req.(*wrapperspb.StringValue).GetValue()), nil
	}
	if interceptor == nil {
		return h(ctx, in)
	}
	return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodEcho}, h)
}

// testServer is the service's implementation and what the tests observe
// of it, server-side.
type testServer struct {
	store idem.Store
	icpt  *idemgrpc.Interceptor
	addr  string

	calls  atomic.Int64 // runs of Create's handler: its effect
	echoes atomic.Int64 // runs of Echo's handler

	// handle is Create's behaviour; n is the number of this run (from
	// 1). Nil answers {"order": n, "item": req.item}.
	handle func(ctx context.Context, req *structpb.Struct, n int64) (*structpb.Struct, error)

	mu      sync.Mutex
	keys    []string                  // the idempotency-key of every call that reached the server
	answers map[codes.Code]int        // every call's answer, by code
	arrived []time.Time               // when each call reached the server
	onCode  func(c codes.Code)        // called after each answer, if set
	onCall  func(ctx context.Context) // called with each call's context as it reaches the server, if set
}

func (s *testServer) create(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	n := s.calls.Add(1)
	if s.handle != nil {
		return s.handle(ctx, req, n)
	}
	return order(n, req), nil
}

// order is the default answer of Create's run n.
func order(n int64, req *structpb.Struct) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		"order": structpb.NewNumberValue(float64(n)),
		"item":  req.GetFields()["item"],
	}}
}

// observe is the outermost server interceptor: it records what reached
// the server and what it answered.
func (s *testServer) observe(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.keys = append(s.keys, md.Get(idemgrpc.MetadataKey)...)
	s.arrived = append(s.arrived, time.Now())
	onCall := s.onCall
	s.mu.Unlock()
	if onCall != nil {
		onCall(ctx)
	}
	resp, err := handler(ctx, req)
	c := status.Code(err)
	s.mu.Lock()
	s.answers[c]++
	on := s.onCode
	s.mu.Unlock()
	if on != nil {
		on(c)
	}
	return resp, err
}

func (s *testServer) answered(c codes.Code) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answers[c]
}

func (s *testServer) seenKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// setup starts the test service on a TCP listener on 127.0.0.1, guarded
// by an Interceptor for cfg (its Store defaults to a new memstore), and
// returns it with a connection to it (through the client interceptors
// given).
func setup(t *testing.T, cfg *idemgrpc.Config, prepare func(*testServer), clientInterceptors ...grpc.UnaryClientInterceptor) (*testServer, *grpc.ClientConn) {
	t.Helper()
	c := idemgrpc.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Store == nil {
		c.Store = memstore.New(nil)
	}
	icpt, err := idemgrpc.New(&c)
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{store: c.Store, icpt: icpt, answers: map[codes.Code]int{}}
	if prepare != nil {
		prepare(s)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.observe, icpt.Unary))
	srv.RegisterService(&ordersDesc, s)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	s.addr = lis.Addr().String()
	conn, err := grpc.NewClient(s.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(clientInterceptors...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, conn
}

// withKey returns ctx carrying key as the call's idempotency-key.
func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
}

// incomingWithKey returns ctx as a server sees a call with key.
func incomingWithKey(ctx context.Context, key string) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs(idemgrpc.MetadataKey, key))
}

// item returns a Create request for item.
func item(name string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{"item": structpb.NewStringValue(name)}}
}

// call is a Create call's outcome, as the client saw it.
type call struct {
	reply    *structpb.Struct
	err      error
	header   metadata.MD
	replayed bool
}

func create(ctx context.Context, conn *grpc.ClientConn, req *structpb.Struct) call {
	var c call
	reply := new(structpb.Struct)
	c.err = conn.Invoke(ctx, methodCreate, req, reply, grpc.Header(&c.header))
	if c.err == nil {
		c.reply = reply
	}
	c.replayed = len(c.header.Get(idemgrpc.MetadataReplayed)) == 1 && c.header.Get(idemgrpc.MetadataReplayed)[0] == "true"
	return c
}

// errorInfo returns the reason of err's ErrorInfo detail in the idem
// domain, or "".
func errorInfo(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == idemgrpc.ErrorDomain {
			return ei.GetReason()
		}
	}
	return ""
}

// retryInfo returns the delay of err's RetryInfo detail, or -1.
func retryInfo(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return -1
}

// flakyStore wraps a store and fails the operations switched on.
type flakyStore struct {
	idem.Store
	acquire, complete atomic.Bool
}

var errDown = errors.New("store down")

func (s *flakyStore) Acquire(ctx context.Context, req idem.AcquireRequest) (idem.AcquireResult, error) {
	if s.acquire.Load() {
		return idem.AcquireResult{}, errDown
	}
	return s.Store.Acquire(ctx, req)
}

func (s *flakyStore) Complete(ctx context.Context, l idem.Lease, resp idem.Response, retention time.Duration) error {
	if s.complete.Load() {
		return errDown
	}
	return s.Store.Complete(ctx, l, resp, retention)
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
