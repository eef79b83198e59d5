package grpctest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
)

// ledger is a Create service whose handler inserts an order row and
// completes its record in the same transaction, like orders, with a hook
// that runs before the transaction (wait is given the run's number).
type ledger struct {
	db   *sql.DB
	runs *atomic.Int64 // shared by the instances: the runs of the effect
	wait func(ctx context.Context, run int64)
}

func (l *ledger) create(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	run := l.runs.Add(1)
	if l.wait != nil {
		l.wait(ctx, run)
	}
	// The transaction does not follow ctx: a handler that outlived its
	// lease without looking still gets as far as completing.
	tctx := context.WithoutCancel(ctx)
	tx, err := l.db.BeginTx(tctx, nil)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(tctx, `INSERT INTO orders (sku, run) VALUES ($1, $2)`, req.GetFields()["sku"].GetStringValue(), run); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp := &structpb.Struct{Fields: map[string]*structpb.Value{
		"sku": req.GetFields()["sku"],
		"run": structpb.NewNumberValue(float64(run)),
	}}
	stored, err := idemgrpc.EncodeMessage(resp)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := idem.FromContext(ctx).CompleteTx(tctx, tx, stored); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err := tx.Commit(); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return resp, nil
}

// noRenewals is a store whose renewals fail while cut is set: an instance
// cut off from the store while its handler runs.
type noRenewals struct {
	*sqlstore.Store
	cut atomic.Bool
}

func (s *noRenewals) Extend(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
	if s.cut.Load() {
		return idem.Lease{}, errors.New("cut off from the store")
	}
	return s.Store.Extend(ctx, l, ttl)
}

// instance starts a gRPC server guarded by an interceptor over store and
// returns a client connection to it through the retrying client.
func instance(t *testing.T, store idem.Store, cfg idemgrpc.Config, svc *ledger, observe grpc.UnaryServerInterceptor) *grpc.ClientConn {
	t.Helper()
	cfg.Store = store
	icpt, err := idemgrpc.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(observe, icpt.Unary))
	srv.RegisterService(&ordersDesc, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	client, err := idemgrpc.NewClient(&idemgrpc.ClientConfig{MaxAttempts: 100000, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client.Unary))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// twoPools opens the test's PostgreSQL schema twice (a pool per instance)
// with the orders table and the idem tables.
func twoPools(t *testing.T) (*sql.DB, *sql.DB) {
	t.Helper()
	a, dsn := testdb.Postgres(t)
	a.SetMaxOpenConns(6)
	b := testdb.Open(t, "pgx", dsn, testenv.Postgres)
	b.SetMaxOpenConns(6)
	store, err := sqlstore.New(a, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(`CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, sku TEXT NOT NULL, run BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func newStore(t *testing.T, db *sql.DB) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func countRows(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTwoInstancesOneStore: two server instances, each with its own pool
// and interceptor, on one PostgreSQL store; 40 callers send one Create
// with one key, half to each. The first run holds its key until every
// other caller has been answered Aborted (by either instance): one run,
// one row, every caller the same answer.
func TestTwoInstancesOneStore(t *testing.T) {
	t.Parallel()
	const n = 40
	dbA, dbB := twoPools(t)
	var runs, aborted atomic.Int64
	all := make(chan struct{})
	var once sync.Once
	observe := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if status.Code(err) == codes.Aborted && aborted.Add(1) >= n-1 {
			once.Do(func() { close(all) })
		}
		return resp, err
	}
	wait := func(ctx context.Context, run int64) {
		select {
		case <-all:
		case <-time.After(30 * time.Second):
		}
	}
	cfg := idemgrpc.Config{RetryDelay: 2 * time.Millisecond}
	conns := []*grpc.ClientConn{
		instance(t, newStore(t, dbA), cfg, &ledger{db: dbA, runs: &runs, wait: wait}, observe),
		instance(t, newStore(t, dbB), cfg, &ledger{db: dbB, runs: &runs, wait: wait}, observe),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, fmt.Sprint("two-", time.Now().UnixNano()))
	req := &structpb.Struct{Fields: map[string]*structpb.Value{"sku": structpb.NewStringValue("BOOK-1")}}
	replies := make([]*structpb.Struct, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			replies[g] = new(structpb.Struct)
			errs[g] = conns[g%2].Invoke(ctx, methodCreate, req, replies[g])
		})
	}
	wg.Wait()
	if runs.Load() != 1 || countRows(t, dbA) != 1 {
		t.Fatalf("%d runs, %d order rows; want 1 and 1", runs.Load(), countRows(t, dbA))
	}
	for g := range n {
		if errs[g] != nil {
			t.Fatalf("caller %d: %v", g, errs[g])
		}
		if !proto.Equal(replies[g], replies[0]) {
			t.Fatalf("caller %d got %v, caller 0 %v", g, replies[g], replies[0])
		}
	}
}

// TestLeaseLostAcrossInstances: instance A's handler outlives its lease
// (A cannot renew: cut off from the store), instance B takes the key over
// for the caller's retry and completes it; then A's handler, which did not
// look at its context, reaches its completion. A's transaction must roll
// back (one order row), and A's caller must get B's answer, the one every
// retry replays, not an answer of its own.
func TestLeaseLostAcrossInstances(t *testing.T) {
	t.Parallel()
	dbA, dbB := twoPools(t)
	var runs atomic.Int64
	bDone := make(chan struct{})
	storeA := &noRenewals{Store: newStore(t, dbA)}
	storeA.cut.Store(true)
	pass := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	cfg := idemgrpc.Config{Lease: 300 * time.Millisecond, RetryDelay: 10 * time.Millisecond}
	connA := instance(t, storeA, cfg, &ledger{db: dbA, runs: &runs, wait: func(ctx context.Context, run int64) {
		select {
		case <-bDone:
		case <-time.After(30 * time.Second):
		}
	}}, pass)
	connB := instance(t, newStore(t, dbB), cfg, &ledger{db: dbB, runs: &runs}, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err == nil {
			select {
			case <-bDone:
			default:
				close(bDone)
			}
		}
		return resp, err
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, fmt.Sprint("lost-", time.Now().UnixNano()))
	req := &structpb.Struct{Fields: map[string]*structpb.Value{"sku": structpb.NewStringValue("BOOK-1")}}
	first := make(chan error, 1)
	replyA := new(structpb.Struct)
	go func() { first <- connA.Invoke(ctx, methodCreate, req, replyA) }()
	waitRuns := time.Now().Add(10 * time.Second)
	for runs.Load() == 0 {
		if time.Now().After(waitRuns) {
			t.Fatal("A's handler never ran")
		}
		time.Sleep(time.Millisecond)
	}
	// The retry, to B: Aborted while A's lease lives, then B takes over.
	replyB := new(structpb.Struct)
	if err := connB.Invoke(ctx, methodCreate, req, replyB); err != nil {
		t.Fatalf("retry through B: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("A's caller: %v, want B's answer", err)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2 (A's, then B's after A's lease ended)", runs.Load())
	}
	if rows := countRows(t, dbA); rows != 1 {
		t.Fatalf("%d order rows, want 1: A's completion after its lease was lost committed", rows)
	}
	if !proto.Equal(replyA, replyB) || replyB.GetFields()["run"].GetNumberValue() != 2 {
		t.Fatalf("A's caller got %v, B's %v; want B's run 2 for both", replyA, replyB)
	}
}
