package grpctest_test

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/internal/metricstest"
	"github.com/idemkit/idem/memstore"
)

// TestPrometheusCountsGRPCCalls: idemgrpc's interceptor reporting to
// idemprom's Observer, over a real gRPC server on TCP, and the real
// promhttp handler scraped over HTTP after each step: the request
// counters move by the call's outcome under the method's full name, the
// store histogram counts the calls' acquires and completions, and no key
// or scope appears in the output.
func TestPrometheusCountsGRPCCalls(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	obs, err := idemprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()

	const scope, key = "tenant-SCOPE-4417", "key-KEY-9932"
	icpt, err := idemgrpc.New(&idemgrpc.Config{Store: memstore.New(nil), StoreName: "memory", Observer: obs,
		Scope: func(context.Context) (string, error) { return scope, nil }})
	if err != nil {
		t.Fatal(err)
	}
	o := &orders{entered: make(chan struct{}), release: make(chan struct{})}
	close(o.release)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(icpt.Unary))
	srv.RegisterService(&countingDesc, o)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	call := func(k, sku string) codes.Code {
		ctx := context.Background()
		if k != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, k)
		}
		req := &structpb.Struct{Fields: map[string]*structpb.Value{"sku": structpb.NewStringValue(sku)}}
		return status.Code(conn.Invoke(ctx, methodCount, req, new(structpb.Struct)))
	}
	series := func(outcome string) string {
		return `idem_requests_total{outcome="` + outcome + `",route="` + methodCount + `"}`
	}
	want := map[string]float64{}
	check := func(step string) {
		t.Helper()
		got, raw := metricstest.Scrape(t, metrics.URL)
		for s, v := range want {
			if got[s] != v {
				t.Errorf("%s: %s = %v, want %v", step, s, got[s], v)
			}
		}
		if strings.Contains(raw, key) || strings.Contains(raw, scope) {
			t.Errorf("%s: a key or scope in the metrics:\n%s", step, raw)
		}
	}

	if c := call(key, "a"); c != codes.OK {
		t.Fatalf("first call: %v", c)
	}
	want[series("executed")] = 1
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="memory"}`] = 1
	want[`idem_store_operation_duration_seconds_count{operation="complete",result="ok",store="memory"}`] = 1
	check("executed")

	if c := call(key, "a"); c != codes.OK {
		t.Fatalf("replay: %v", c)
	}
	want[series("replayed")] = 1
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="memory"}`] = 2
	check("replayed")

	if c := call(key, "b"); c != codes.FailedPrecondition {
		t.Fatalf("mismatch: %v", c)
	}
	want[series("mismatch")] = 1
	want[`idem_store_operation_duration_seconds_count{operation="acquire",result="ok",store="memory"}`] = 3
	check("mismatch")

	if c := call("", "a"); c != codes.InvalidArgument {
		t.Fatalf("missing key: %v", c)
	}
	want[series("missing_key")] = 1
	check("missing key")

	if n := o.runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
}

const methodCount = "/grpctest.Counted/Create"

// countingDesc serves Create with a handler that counts its runs and
// answers the request's sku.
var countingDesc = grpc.ServiceDesc{
	ServiceName: "grpctest.Counted",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		o := srv.(*orders)
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodCount}, func(ctx context.Context, req any) (any, error) {
			o.runs.Add(1)
			return &structpb.Struct{Fields: map[string]*structpb.Value{"sku": req.(*structpb.Struct).GetFields()["sku"]}}, nil
		})
	}}},
}
