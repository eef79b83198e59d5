package shop_test

import (
	"context"
	"database/sql"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore"
)

// freezer is a TCP proxy to a database server that, once frozen, stops
// passing bytes both ways and holds every connection open: a database
// behind a network that swallows packets.
type freezer struct {
	ln       net.Listener
	upstream string
	frozen   chan struct{}
	once     sync.Once
	mu       sync.Mutex
	conns    []net.Conn
}

func newFreezer(t *testing.T, upstream string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, upstream: upstream, frozen: make(chan struct{})}
	go f.serve()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			c.Close()
		}
	})
	return f
}

func (f *freezer) freeze() { f.once.Do(func() { close(f.frozen) }) }

func (f *freezer) track(c net.Conn) {
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
}

func (f *freezer) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.track(c)
		select {
		case <-f.frozen:
			continue // held open, never answered
		default:
		}
		up, err := net.Dial("tcp", f.upstream)
		if err != nil {
			c.Close()
			continue
		}
		f.track(up)
		go f.pipe(up, c)
		go f.pipe(c, up)
	}
}

// pipe copies src to dst until the freeze, then swallows src.
func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			io.Copy(io.Discard, src)
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A database that stops answering (packets swallowed, connections left
// open) must not hang the shop's reads: GET /orders and GET
// /orders/{order_no} answer 503 UNHEALTHY within a bounded time, as POST
// /orders answers 503 STORE_UNAVAILABLE and GET /healthz 503 UNHEALTHY.
func TestReadsEndWhenDatabaseHangs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dsn := freshPostgres(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	f := newFreezer(t, u.Host)
	u.Host = f.ln.Addr().String()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := shop.Migrate(ctx, db, sqlstore.PostgreSQL); err != nil {
		t.Fatal(err)
	}
	s, err := shop.New(shop.Config{DB: db, Dialect: sqlstore.PostgreSQL, Store: store, Provider: testProvider(t)})
	if err != nil {
		t.Fatal(err)
	}
	user := map[string]string{"X-User-ID": "61"}
	if rec := serve(s, http.MethodGet, "/orders", user, ""); rec.Code != http.StatusOK {
		t.Fatalf("before the freeze: %d %s", rec.Code, rec.Body)
	}
	f.freeze()

	var wg sync.WaitGroup
	for _, target := range []string{"/orders", "/orders/ord_000000000000000000000000"} {
		wg.Go(func() {
			done := make(chan int, 1)
			go func() {
				rec := serve(s, http.MethodGet, target, user, "")
				if rec.Code == http.StatusServiceUnavailable {
					if code := problemCode(t, rec); code != "UNHEALTHY" {
						t.Errorf("GET %s: code %q, want UNHEALTHY", target, code)
					}
				}
				done <- rec.Code
			}()
			select {
			case code := <-done:
				if code != http.StatusServiceUnavailable {
					t.Errorf("GET %s with the database frozen: %d, want 503", target, code)
				}
			case <-time.After(40 * time.Second):
				t.Errorf("GET %s with the database frozen: no answer within 40 s", target)
			}
		})
	}
	wg.Wait()
}
