package shop_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// The test binary doubles as shopd: with SHOPD_CHILD_ARGS set it runs
// shop.Main, as shopd does, with those arguments (a JSON array) and exits, so the end-to-end
// tests drive a real shopd process over real HTTP. The test hooks of the
// child come from its environment (childHooks).
func TestMain(m *testing.M) {
	if raw := os.Getenv("SHOPD_CHILD_ARGS"); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := childHooks(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		signals := make(chan os.Signal, 2)
		signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
		os.Exit(shop.Main(args, os.Stdout, os.Stderr, signals))
	}
	os.Exit(m.Run())
}

// Environment of a shopd child's test hooks (the test binary's, never
// shopd's).
const (
	// envTrace: "1" prints "published <id> <topic>" after the broker
	// confirmed an event (before the relay marks it sent) and "handled
	// <id> <result>" after the loyalty consumer handled a message (before
	// the ack).
	envTrace = "SHOPD_CHILD_TRACE"
	// envHang: "publish" hangs the relay after it printed the first
	// order.paid's "published" line; "commit" hangs the consumer after it
	// printed the first "handled … processed" line: the test kills the
	// child there.
	envHang = "SHOPD_CHILD_HANG"
	// envAckWait is the loyalty durable's AckWait (a Go duration).
	envAckWait = "SHOPD_CHILD_ACKWAIT"
)

// childHooks sets the hooks of a shopd child from its environment.
func childHooks() error {
	if v := os.Getenv(envAckWait); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		shop.SetNATSAckWait(d)
	}
	if os.Getenv(envTrace) == "" {
		return nil
	}
	hang := os.Getenv(envHang)
	var once sync.Once
	hangOnce := func() {
		hung := false
		once.Do(func() { hung = true })
		if hung {
			select {} // killed here
		}
	}
	shop.SetAfterPublish(func(m outbox.Message) {
		fmt.Printf("published %s %s\n", m.ID, m.Topic)
		if hang == "publish" && strings.HasSuffix(m.Topic, "."+shop.EventOrderPaid) {
			hangOnce()
		}
	})
	shop.SetLoyaltyHook(func(m inbox.Message, o inbox.Outcome) {
		fmt.Printf("handled %s %s\n", m.ID, o.Result)
		if hang == "commit" && o.Result == inbox.Processed {
			hangOnce()
		}
	})
	return nil
}

type shopd struct {
	t     *testing.T
	cmd   *exec.Cmd
	base  string
	done  chan error
	found chan string
	// out is all the child printed on stdout.
	out *obstest.LogBuffer
}

// startShopd starts shopd on dataDir (-data) and waits until it listens.
func startShopd(t *testing.T, dataDir string, extra ...string) *shopd {
	t.Helper()
	s := spawnShopd(t, append([]string{"-data", dataDir}, extra...)...)
	s.ready()
	return s
}

// spawnShopd starts shopd with args (after -addr and -log-level); ready
// waits until it listens.
func spawnShopd(t *testing.T, args ...string) *shopd {
	t.Helper()
	return spawnShopdEnv(t, nil, args...)
}

// spawnShopdEnv is spawnShopd with env added to the child's environment.
func spawnShopdEnv(t *testing.T, env []string, args ...string) *shopd {
	t.Helper()
	if !hasFlag(args, "-data") && !hasFlag(args, "-nats-store") {
		// Not ./shopdata/nats in the package's directory.
		args = append(args, "-nats-store", filepath.Join(t.TempDir(), "nats"))
	}
	raw, _ := json.Marshal(append([]string{"-addr", "127.0.0.1:0", "-log-level", "warn"}, args...))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "SHOPD_CHILD_ARGS="+string(raw)), env...)
	cmd.Stderr = &lockedWriter{w: os.Stderr}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &shopd{t: t, cmd: cmd, done: make(chan error, 1), found: make(chan string, 1), out: &obstest.LogBuffer{}}
	lines := bufio.NewScanner(out)
	go func() {
		for lines.Scan() {
			fmt.Fprintln(s.out, lines.Text())
			if rest, ok := strings.CutPrefix(lines.Text(), "shopd listening on "); ok {
				s.found <- strings.Fields(rest)[0]
			}
		}
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-s.done
		}
	})
	return s
}

// ready waits until shopd listens, and sets s.base.
func (s *shopd) ready() {
	s.t.Helper()
	select {
	case s.base = <-s.found:
	case err := <-s.done:
		s.t.Fatalf("shopd exited before listening: %v", err)
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		s.t.Fatal("shopd did not start within 20s")
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (s *shopd) stop() {
	s.t.Helper()
	// A connection the client dialed but never used is "new" to the
	// server, whose Shutdown waits 5 s before it counts as idle.
	client.CloseIdleConnections()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	select {
	case err := <-s.done:
		if err != nil {
			s.t.Fatalf("shopd exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		s.t.Fatal("shopd did not stop within 30s of SIGTERM")
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

type reply struct {
	err    error
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

var client = &http.Client{Timeout: 30 * time.Second}

func do(t *testing.T, method, url, user, key, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("%s %s: read body: %v", method, url, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// countOrders reads the shop's table directly: the effect, not the answers.
func countOrders(t *testing.T, dataDir, where string, args ...any) int {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(dataDir, "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM shop_orders WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestShopdConcurrentRetriesCreateOneOrder(t *testing.T) {
	dir := t.TempDir()
	s := startShopd(t, dir)
	const n = 100
	body := `{"sku":"BOOK-1","quantity":2}`
	replies := make([]reply, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = do(t, "POST", s.base+"/orders", "7", "order-key-1", body)
		})
	}
	close(start)
	wg.Wait()

	var created, processing, firsts int
	orderNo := ""
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			created++
			if r.header.Get("Idempotent-Replayed") != "true" {
				firsts++
			}
			m := r.json(t)
			if orderNo == "" {
				orderNo = m["order_no"].(string)
			} else if m["order_no"] != orderNo {
				t.Errorf("two different orders answered: %v and %v", orderNo, m["order_no"])
			}
		case http.StatusConflict:
			processing++
			if code := r.json(t)["code"]; code != "PROCESSING" {
				t.Errorf("409 with code %v, want PROCESSING", code)
			}
			if r.header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
		default:
			t.Errorf("unexpected answer %d %s (%v)", r.status, r.body, r.err)
		}
	}
	if created == 0 {
		t.Fatal("no request got the 201")
	}
	t.Logf("%d×201 (%d first, %d replayed), %d×409 PROCESSING", created, firsts, created-firsts, processing)
	if firsts != 1 {
		t.Errorf("%d answers came from an execution of the handler, want exactly 1", firsts)
	}
	if got := countOrders(t, dir, "user_id = 7"); got != 1 {
		t.Fatalf("%d order rows for one key, want 1", got)
	}

	// A retry after the first finished replays it.
	r := do(t, "POST", s.base+"/orders", "7", "order-key-1", body)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.json(t)["order_no"] != orderNo {
		t.Fatalf("retry: %d %v %s", r.status, r.header, r.body)
	}
	// The same request with its JSON keys in another order and other spacing replays too.
	r = do(t, "POST", s.base+"/orders", "7", "order-key-1", "{ \"quantity\": 2,\n  \"sku\": \"BOOK-1\" }")
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.json(t)["order_no"] != orderNo {
		t.Fatalf("reordered JSON: %d %v %s", r.status, r.header, r.body)
	}
	// The same key with another quantity is key reuse: 422, and no new order.
	r = do(t, "POST", s.base+"/orders", "7", "order-key-1", `{"sku":"BOOK-1","quantity":3}`)
	if r.status != http.StatusUnprocessableEntity || r.json(t)["code"] != "KEY_MISMATCH" {
		t.Fatalf("other quantity: %d %s", r.status, r.body)
	}
	if got := countOrders(t, dir, "user_id = 7"); got != 1 {
		t.Fatalf("%d order rows after the mismatch, want 1", got)
	}
	// The order is readable by its owner only.
	if r := do(t, "GET", s.base+"/orders/"+orderNo, "7", "", ""); r.status != http.StatusOK || r.json(t)["quantity"] != float64(2) {
		t.Fatalf("GET own order: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", s.base+"/orders/"+orderNo, "8", "", ""); r.status != http.StatusNotFound {
		t.Fatalf("GET another user's order: %d %s", r.status, r.body)
	}

	// After a restart on the same data directory the key still replays.
	s.stop()
	s2 := startShopd(t, dir)
	r = do(t, "POST", s2.base+"/orders", "7", "order-key-1", body)
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.json(t)["order_no"] != orderNo {
		t.Fatalf("after restart: %d %v %s", r.status, r.header, r.body)
	}
	if got := countOrders(t, dir, "user_id = 7"); got != 1 {
		t.Fatalf("%d order rows after restart, want 1", got)
	}
	s2.stop()
}

func TestShopdWaitModeReplaysToEveryone(t *testing.T) {
	dir := t.TempDir()
	s := startShopd(t, dir, "-wait", "10s")
	const n = 50
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = do(t, "POST", s.base+"/orders", "9", "wait-key", `{"sku":"SKU-1","quantity":1}`)
		})
	}
	wg.Wait()
	orderNo := ""
	replayed := 0
	for _, r := range replies {
		if r.status != http.StatusCreated {
			t.Fatalf("wait mode answered %d %s (%v), want 201 for everyone", r.status, r.body, r.err)
		}
		no := r.json(t)["order_no"].(string)
		if orderNo == "" {
			orderNo = no
		} else if no != orderNo {
			t.Fatalf("two orders: %s and %s", orderNo, no)
		}
		if r.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d replays, want %d (one first execution)", replayed, n-1)
	}
	if got := countOrders(t, dir, "user_id = 9"); got != 1 {
		t.Fatalf("%d order rows, want 1", got)
	}
}

func TestShopdGracefulShutdownFinishesInFlight(t *testing.T) {
	dir := t.TempDir()
	s := startShopd(t, dir)
	const n = 40
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = do(t, "POST", s.base+"/orders", "11", fmt.Sprintf("shutdown-%d", i), `{"sku":"BOOK-1","quantity":1}`)
		})
	}
	time.Sleep(5 * time.Millisecond)
	s.stop()
	wg.Wait()
	// Every request either got its 201 (and its order exists) or never
	// reached the server (connection refused): nothing half-written.
	created := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			created++
		case 0: // refused after the listener closed
			t.Logf("not served: %v", r.err)
		default:
			t.Errorf("answer during shutdown: %d %s", r.status, r.body)
		}
	}
	if got := countOrders(t, dir, "user_id = 11"); got != created {
		t.Fatalf("%d order rows, %d requests answered 201", got, created)
	}
}

func TestShopdUsersAreSeparateScopes(t *testing.T) {
	dir := t.TempDir()
	s := startShopd(t, dir)
	a := do(t, "POST", s.base+"/orders", "21", "same-key", `{"sku":"SKU-1","quantity":1}`)
	b := do(t, "POST", s.base+"/orders", "22", "same-key", `{"sku":"BOOK-1","quantity":5}`)
	if a.status != http.StatusCreated || b.status != http.StatusCreated {
		t.Fatalf("answers %d %s / %d %s", a.status, a.body, b.status, b.body)
	}
	if a.json(t)["order_no"] == b.json(t)["order_no"] || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("user 22's key met user 21's record")
	}
	list := do(t, "GET", s.base+"/orders", "22", "", "")
	var got struct{ Orders []shop.Order }
	if err := json.Unmarshal(list.body, &got); err != nil || len(got.Orders) != 1 || got.Orders[0].SKU != "BOOK-1" {
		t.Fatalf("user 22's list: %s", list.body)
	}
	if !bytes.Contains(do(t, "GET", s.base+"/healthz", "", "", "").body, []byte(`"ok"`)) {
		t.Fatal("healthz not ok")
	}
}
