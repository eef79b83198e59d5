package killsoak_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
)

const paySecret = "killsoak-pay-secret"

// catalog is the shop's catalogue: LIMITED runs out under the traffic,
// PLENTY does not; the coupon's total runs out too.
var catalog = shop.Catalog{
	Products: []shop.Product{
		{SKU: "LIMITED", Name: "Limited", PriceCents: 1299, Stock: 150},
		{SKU: "PLENTY", Name: "Plenty", PriceCents: 2500, Stock: 1_000_000},
	},
	Coupons: []shop.Coupon{{ID: 1, Name: "500 off", DiscountCents: 500, Total: 60}},
}

// rig is two shopd instances on one PostgreSQL schema of the test's own,
// the machine's Redis and NATS (a namespace of the test's own), each
// reached directly or, with faults, through netfault proxies.
type rig struct {
	t      *testing.T
	db     *sql.DB
	events string
	nats   string // the NATS server's URL (not the proxy's)
	args   []string
	dir    string
	insts  []*instance
	// Proxies between shopd and its servers, and in front of each
	// instance; nil without faults.
	pg, redis, broker *netfault.Proxy
	front             []*netfault.Proxy
}

// newRig starts n instances; with proxies, every connection of shopd to
// PostgreSQL, Redis and NATS, and of the clients to shopd, goes through a
// proxy of its own.
func newRig(t *testing.T, n int, proxies bool) *rig {
	t.Helper()
	db, pgURL := testdb.Postgres(t)
	redisAddr := testenv.Redis.Need(t)
	natsURL := testenv.NATS.Need(t)
	r := &rig{t: t, db: db, nats: natsURL, dir: t.TempDir(), events: natsNamespace(t, natsURL)}
	redisURL := "redis://" + redisAddr + "/0"
	brokerURL := natsURL
	if proxies {
		r.pg = proxyTo(t, hostOf(t, pgURL))
		r.redis = proxyTo(t, redisAddr)
		r.broker = proxyTo(t, hostOf(t, natsURL))
		pgURL = withHost(t, pgURL, r.pg.Addr())
		redisURL = "redis://" + r.redis.Addr() + "/0"
		brokerURL = withHost(t, natsURL, r.broker.Addr())
	}
	cat, err := json.Marshal(catalog)
	if err != nil {
		t.Fatal(err)
	}
	catPath := filepath.Join(r.dir, "catalog.json")
	if err := os.WriteFile(catPath, cat, 0o600); err != nil {
		t.Fatal(err)
	}
	r.args = []string{"-db", pgURL, "-redis", redisURL, "-broker", brokerURL, "-events", r.events,
		"-pay-secret", paySecret, "-pay-timeout", payTimeout.String(), "-catalog", catPath, "-log-level", "warn"}
	for i := range n {
		in := &instance{r: r, n: i, addr: freeAddr(t)}
		r.insts = append(r.insts, in)
		t.Cleanup(in.kill)
		// One at a time: the first migrates and seeds.
		if err := in.start(); err != nil {
			t.Fatal(err)
		}
		if proxies {
			r.front = append(r.front, proxyTo(t, in.addr))
		}
	}
	return r
}

// payTimeout is shopd's -pay-timeout: orders left unpaid are closed
// during the run.
const payTimeout = 20 * time.Second

// bases are the URLs the clients use: the instances', or their front
// proxies'.
func (r *rig) bases() []string {
	var out []string
	for i, in := range r.insts {
		addr := in.addr
		if r.front != nil {
			addr = r.front[i].Addr()
		}
		out = append(out, "http://"+addr)
	}
	return out
}

// instance is one shopd process, started again on the same address after
// each kill.
type instance struct {
	r    *rig
	n    int
	addr string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

// start starts the instance and waits until it listens; a start that
// fails (its port taken meanwhile by another process's outgoing
// connection) is tried again.
func (in *instance) start() error {
	var last error
	for try := 0; try < 5; try++ {
		if last = in.spawn(); last == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("shopd %d did not start: %v\n%s", in.n, last, in.logTail())
}

func (in *instance) spawn() error {
	raw, _ := json.Marshal(append([]string{"-addr", in.addr}, in.r.args...))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChildArgs+"="+string(raw))
	setDeathSignal(cmd)
	logf, err := os.OpenFile(in.logPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	listening := make(chan struct{})
	go func() {
		lines := bufio.NewScanner(out)
		said := false
		for lines.Scan() {
			if !said && strings.HasPrefix(lines.Text(), "shopd listening on ") {
				said = true
				close(listening)
			}
		}
		cmd.Wait()
		close(done)
	}()
	select {
	case <-listening:
	case <-done:
		return fmt.Errorf("shopd %d exited before listening: %v", in.n, cmd.ProcessState)
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("shopd %d did not listen within 90s", in.n)
	}
	in.mu.Lock()
	in.cmd, in.done = cmd, done
	in.starts++
	in.mu.Unlock()
	return nil
}

// kill kills the instance with SIGKILL, if it runs, and waits until it is
// gone.
func (in *instance) kill() {
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.cmd = nil
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

func (in *instance) logPath() string {
	return filepath.Join(in.r.dir, fmt.Sprintf("shopd-%d.log", in.n))
}

// logTail is the end of the instance's log (every run of it).
func (in *instance) logTail() string {
	b, _ := os.ReadFile(in.logPath())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func proxyTo(t *testing.T, target string) *netfault.Proxy {
	t.Helper()
	p, err := netfault.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("no host in %q: %v", raw, err)
	}
	return u.Host
}

func withHost(t *testing.T, raw, host string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host
	return u.String()
}

// natsNamespace returns an -events name of t's own and deletes its
// streams when t ends.
func natsNamespace(t *testing.T, natsURL string) string {
	t.Helper()
	name := testdb.RandomName("ks")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		js, close, err := jetStream(natsURL)
		if err != nil {
			t.Logf("clean up %s: %v", name, err)
			return
		}
		defer close()
		for _, st := range []string{streamOf(name), deadStreamOf(name)} {
			if err := js.DeleteStream(ctx, st); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Logf("delete stream %s: %v", st, err)
			}
		}
	})
	return name
}

// The names shopd declares on NATS under -events name (a name of
// lower-case letters and digits), as package shop's doc says.
func streamOf(name string) string     { return strings.ToUpper(name) + "_ORDERS" }
func deadStreamOf(name string) string { return strings.ToUpper(name) + "_ORDERS_DEAD" }
func durableOf(name string) string    { return name + "-loyalty" }

func jetStream(natsURL string) (jetstream.JetStream, func(), error) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}
