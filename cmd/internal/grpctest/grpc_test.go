package grpctest_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
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
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

const methodCreate = "/grpctest.Orders/Create"

// orders is the service: Create inserts an order row and completes the
// call's record in the same transaction (CompleteTx), so the row and the
// stored answer commit together.
type orders struct {
	db      *sql.DB
	insert  string // the INSERT of an order, in the database's dialect
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	runs    atomic.Int64
}

// creator is a service of the test's grpctest.Orders/Create method.
type creator interface {
	create(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)
}

// ordersDesc describes grpctest.Orders, served by a creator (orders,
// ledger).
var ordersDesc = grpc.ServiceDesc{
	ServiceName: "grpctest.Orders",
	HandlerType: (*creator)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		c := srv.(creator)
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodCreate}, func(ctx context.Context, req any) (any, error) {
			return c.create(ctx, req.(*structpb.Struct))
		})
	}}},
}

func (o *orders) create(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	o.runs.Add(1)
	o.once.Do(func() { close(o.entered) })
	select {
	case <-o.release:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, o.insert, req.GetFields()["sku"].GetStringValue()); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp := &structpb.Struct{Fields: map[string]*structpb.Value{
		"sku":    req.GetFields()["sku"],
		"status": structpb.NewStringValue("created"),
	}}
	stored, err := idemgrpc.EncodeMessage(resp)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := idem.FromContext(ctx).CompleteTx(ctx, tx, stored); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err := tx.Commit(); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return resp, nil
}

// TestConcurrentDuplicatesSQL: on SQLite and PostgreSQL, 50 callers send
// one Create with one key over TCP through the retrying client; the
// handler runs once and holds the key until the others have all been
// answered Aborted; one order row exists, and every caller gets the same
// answer.
func TestConcurrentDuplicatesSQL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		open   func(t *testing.T) (*sql.DB, sqlstore.Dialect)
		create string
		insert string
	}{
		{"sqlite", func(t *testing.T) (*sql.DB, sqlstore.Dialect) {
			db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "orders.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return db, sqlstore.SQLite
		}, `CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)`, `INSERT INTO orders (sku) VALUES (?)`},
		{"postgres", func(t *testing.T) (*sql.DB, sqlstore.Dialect) {
			db, _ := testdb.Postgres(t)
			db.SetMaxOpenConns(8)
			return db, sqlstore.PostgreSQL
		}, `CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, sku TEXT NOT NULL)`, `INSERT INTO orders (sku) VALUES ($1)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, dialect := tc.open(t)
			ctx := context.Background()
			store, err := sqlstore.New(db, &sqlstore.Config{Dialect: dialect})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, tc.create); err != nil {
				t.Fatal(err)
			}
			runDuplicates(t, db, store, tc.insert)
		})
	}
}

func runDuplicates(t *testing.T, db *sql.DB, store idem.Store, insert string) {
	const n = 50
	o := &orders{db: db, insert: insert, entered: make(chan struct{}), release: make(chan struct{})}
	var aborted atomic.Int64
	var releaseOnce sync.Once
	observe := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if status.Code(err) == codes.Aborted && aborted.Add(1) >= n-1 {
			releaseOnce.Do(func() { close(o.release) })
		}
		return resp, err
	}
	icpt, err := idemgrpc.New(&idemgrpc.Config{Store: store, RetryDelay: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(observe, icpt.Unary))
	srv.RegisterService(&ordersDesc, o)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	client, err := idemgrpc.NewClient(&idemgrpc.ClientConfig{MaxAttempts: 100000})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client.Unary))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "order-"+fmt.Sprint(time.Now().UnixNano()))
	req := &structpb.Struct{Fields: map[string]*structpb.Value{"sku": structpb.NewStringValue("BOOK-1")}}
	replies := make([]*structpb.Struct, n)
	errs := make([]error, n)
	replayed := make([]bool, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			var header metadata.MD
			reply := new(structpb.Struct)
			errs[g] = conn.Invoke(ctx, methodCreate, req, reply, grpc.Header(&header))
			replies[g], replayed[g] = reply, len(header.Get(idemgrpc.MetadataReplayed)) > 0
		})
	}
	wg.Wait()

	if o.runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", o.runs.Load())
	}
	var rows int
	if err := db.QueryRowContext(context.Background(), `SELECT count(*) FROM orders`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d order rows, want 1", rows)
	}
	nReplayed := 0
	for g := range n {
		if errs[g] != nil {
			t.Fatalf("caller %d: %v", g, errs[g])
		}
		if !proto.Equal(replies[g], replies[0]) || replies[g].GetFields()["status"].GetStringValue() != "created" {
			t.Fatalf("caller %d got %v, caller 0 %v", g, replies[g], replies[0])
		}
		if replayed[g] {
			nReplayed++
		}
	}
	if nReplayed != n-1 {
		t.Errorf("%d replays, want %d", nReplayed, n-1)
	}
	if aborted.Load() < n-1 {
		t.Errorf("%d Aborted answers, want at least %d", aborted.Load(), n-1)
	}
}
