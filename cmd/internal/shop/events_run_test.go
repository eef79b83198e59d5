package shop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testenv"
)

// runShopd runs shopd (Run) with args until the test ends, and returns
// its base URL and its standard output.
func runShopd(t *testing.T, args ...string) (string, *obstest.LogBuffer) {
	t.Helper()
	var stdout, stderr obstest.LogBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- shop.Run(ctx, args, &stdout, &stderr) }()
	t.Cleanup(func() {
		client.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if t.Failed() {
			t.Logf("shopd's stderr:\n%s", stderr.String())
		}
	})
	return waitFor(t, &stdout, regexp.MustCompile(`shopd listening on (\S+)`))[1], &stdout
}

// payAndSeePoints places an order of one SKU-1 (1299 cents) for user
// through shopd at base, pays it with a signed callback sent 5 times,
// and polls GET /users/me/points until the points appear (one order.paid
// row of 120 points); then it refunds the order and polls until they are
// taken back.
func payAndSeePoints(t *testing.T, base string, user int64) {
	t.Helper()
	uid := strconv.FormatInt(user, 10)
	r := do(t, "POST", base+"/orders", uid, "order-"+uid, `{"sku":"SKU-1","quantity":1}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create order: %d %s", r.status, r.body)
	}
	var o shop.Order
	if err := json.Unmarshal([]byte(r.body), &o); err != nil {
		t.Fatal(err)
	}
	body := []byte(fmt.Sprintf(`{"order_no":%q,"trade_no":"T-%s","amount_cents":%d,"status":"SUCCESS"}`, o.OrderNo, o.OrderNo, o.AmountCents))
	for range 5 {
		req, _ := http.NewRequest("POST", base+"/payments/callback", bytes.NewReader(body))
		req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(testPaySecret, time.Now(), body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("callback: %d", resp.StatusCode)
		}
	}
	want := shop.PointsFor(o.AmountCents)
	p := pollPoints(t, base, uid, func(p shop.Points) bool { return len(p.Ledger) > 0 })
	if p.Balance != want || len(p.Ledger) != 1 || p.Ledger[0].OrderNo != o.OrderNo || p.Ledger[0].Event != shop.EventOrderPaid || p.Ledger[0].Points != want {
		t.Fatalf("points after paying: %+v, want %d from one order.paid", p, want)
	}

	if r := do(t, "POST", base+"/orders/"+o.OrderNo+"/refunds", uid, "refund-"+uid, ""); r.status != http.StatusCreated {
		t.Fatalf("refund: %d %s", r.status, r.body)
	}
	p = pollPoints(t, base, uid, func(p shop.Points) bool { return len(p.Ledger) > 1 })
	if p.Balance != 0 || len(p.Ledger) != 2 || p.Ledger[1].Event != shop.EventOrderRefunded || p.Ledger[1].Points != -want {
		t.Fatalf("points after the refund: %+v, want 0 (+%d, -%d)", p, want, want)
	}
	// Nothing more arrives: the events were consumed once.
	time.Sleep(time.Second)
	if p := pollPoints(t, base, uid, func(shop.Points) bool { return true }); p.Balance != 0 || len(p.Ledger) != 2 {
		t.Fatalf("points a second later: %+v, want the same two rows", p)
	}
}

// pollPoints reads GET /users/me/points until done says so, for at most
// 30 s.
func pollPoints(t *testing.T, base, uid string, done func(shop.Points) bool) shop.Points {
	t.Helper()
	var p shop.Points
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := do(t, "GET", base+"/users/me/points", uid, "", "")
		if r.status != http.StatusOK {
			t.Fatalf("GET /users/me/points: %d %s", r.status, r.body)
		}
		p = shop.Points{}
		if err := json.Unmarshal([]byte(r.body), &p); err != nil {
			t.Fatal(err)
		}
		if done(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("points after 30s: %+v", p)
		}
	}
}

// shopd with no -broker starts its embedded NATS server: the order's
// events go through it and the loyalty consumer grants the points, then
// takes them back.
func TestRunEmbeddedNATSGrantsPoints(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	base, stdout := runShopd(t, "-addr", "127.0.0.1:0", "-data", data, "-pay-secret", testPaySecret)
	want := "events: embedded NATS JetStream nats://127.0.0.1:"
	if !strings.Contains(stdout.String(), want) || !strings.Contains(stdout.String(), filepath.Join(data, "nats")) {
		t.Errorf("shopd's output does not say %q and the store under -data:\n%s", want, stdout.String())
	}
	payAndSeePoints(t, base, 42)

	// /metrics heard the loyalty consumer and the relay: two events
	// processed (order.paid, order.refunded), the duplicates of the five
	// callbacks never became events, and the relay published both.
	r := do(t, "GET", base+"/metrics", "", "", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", r.status)
	}
	for _, want := range []string{
		`idem_inbox_messages_total{group="shop-loyalty",result="processed"} 2`,
		`idem_outbox_published_total{relay="shop"} 2`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("/metrics has no %q:\n%s", want, grepLines(string(r.body), "idem_inbox", "idem_outbox"))
		}
	}
}

// grepLines returns the lines of s that contain one of subs.
func grepLines(s string, subs ...string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(line, sub) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// brokerNamespace returns an -events name of t's own on the broker svc at
// url, and deletes what shopd declares under it (streams, or exchange and
// queues) when t ends: tests on the machine's broker run at once, each in
// its namespace, and leave nothing behind.
func brokerNamespace(t *testing.T, svc testenv.Service, url string) string {
	t.Helper()
	name := fmt.Sprintf("t%x", rand.Uint64())
	streams, exchange, queues := shop.BrokerNames(name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		switch svc.Name {
		case testenv.NATS.Name:
			nc, err := nats.Connect(url)
			if err != nil {
				t.Logf("clean up %s: %v", name, err)
				return
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Logf("clean up %s: %v", name, err)
				return
			}
			for _, st := range streams {
				if err := js.DeleteStream(ctx, st); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Logf("delete stream %s: %v", st, err)
				}
			}
		case testenv.RabbitMQ.Name:
			conn, err := amqp.Dial(url)
			if err != nil {
				t.Logf("clean up %s: %v", name, err)
				return
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Logf("clean up %s: %v", name, err)
				return
			}
			defer ch.Close()
			for _, q := range queues {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Logf("delete queue %s: %v", q, err)
					return // the channel is closed
				}
			}
			if err := ch.ExchangeDelete(exchange, false, false); err != nil {
				t.Logf("delete exchange %s: %v", exchange, err)
			}
		}
	})
	return name
}

// The same against the NATS server and the RabbitMQ broker of the
// machine, each in an -events namespace of its own, so that the subtests
// and the other tests on these brokers run at once.
func TestRunBrokersGrantPoints(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		svc  testenv.Service
		want string
	}{
		{"nats", testenv.NATS, "events: NATS JetStream nats://"},
		{"amqp", testenv.RabbitMQ, "events: RabbitMQ amqp://"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url := c.svc.Need(t)
			ns := brokerNamespace(t, c.svc, url)
			base, stdout := runShopd(t, "-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), "data"),
				"-pay-secret", testPaySecret, "-broker", url, "-events", ns)
			if !strings.Contains(stdout.String(), c.want) || !strings.Contains(stdout.String(), ", names "+ns+" (") {
				t.Errorf("shopd's output does not say %q and the names %s:\n%s", c.want, ns, stdout.String())
			}
			payAndSeePoints(t, base, 1+rand.Int64N(1<<40))
		})
	}
}

// Two shopd on one -data each get an embedded NATS store of their own
// (two servers must never share one): the second takes nats.2. Two given
// one -nats-store: the second refuses to start.
func TestRunEmbeddedNATSStorePerProcess(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	args := []string{"-addr", "127.0.0.1:0", "-data", data, "-pay-secret", testPaySecret}
	_, first := runShopd(t, args...)
	base, second := runShopd(t, args...)
	for _, c := range []struct {
		out  *obstest.LogBuffer
		want string
	}{{first, filepath.Join(data, "nats") + ")"}, {second, filepath.Join(data, "nats.2") + ")"}} {
		if !strings.Contains(c.out.String(), "(store "+c.want) {
			t.Errorf("shopd's output does not name the store %s:\n%s", c.want, c.out.String())
		}
	}
	payAndSeePoints(t, base, 5)

	store := filepath.Join(t.TempDir(), "nats")
	_, _ = runShopd(t, "-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), "a"), "-nats-store", store)
	var stdout, stderr bytes.Buffer
	err := shop.Run(t.Context(), []string{"-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), "b"), "-nats-store", store}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "another shopd") {
		t.Fatalf("Run on a -nats-store in use: %v, want an error saying another shopd holds it", err)
	}
	if strings.Contains(stdout.String(), "listening") {
		t.Errorf("shopd served: %s", stdout.String())
	}
}

// Two shopd processes on one PostgreSQL database and one broker (the
// machine's NATS, then its RabbitMQ): their relays share the outbox, their
// consumers the queue or durable; each paid order's points are granted
// once: one ledger row per order, whichever process took the callback.
func TestShopdTwoProcessesOneBrokerGrantOnce(t *testing.T) {
	t.Parallel()
	for _, svc := range []testenv.Service{testenv.NATS, testenv.RabbitMQ} {
		t.Run(svc.Name, func(t *testing.T) {
			t.Parallel()
			url := svc.Need(t)
			db, dbArg := postgresBackend.fresh(t)
			args := []string{"-db", dbArg, "-pay-secret", testPaySecret, "-broker", url, "-events", brokerNamespace(t, svc, url)}
			procs := []*shopd{spawnShopd(t, args...), spawnShopd(t, args...)}
			for _, p := range procs {
				p.ready()
			}
			user := 1 + rand.Int64N(1<<40)
			uid := strconv.FormatInt(user, 10)
			const orders = 6
			for i := range orders {
				base := procs[i%2].base
				r := do(t, "POST", base+"/orders", uid, fmt.Sprintf("two-%d", i), `{"sku":"SKU-1","quantity":1}`)
				if r.status != http.StatusCreated {
					t.Fatalf("create order: %d %s", r.status, r.body)
				}
				var o shop.Order
				if err := json.Unmarshal(r.body, &o); err != nil {
					t.Fatal(err)
				}
				body := []byte(callbackBody(o.OrderNo, "T-"+o.OrderNo, o.AmountCents, "SUCCESS"))
				for _, p := range procs { // the provider calls back twice, to both
					req, _ := http.NewRequest("POST", p.base+"/payments/callback", bytes.NewReader(body))
					req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(testPaySecret, time.Now(), body))
					resp, err := client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("callback: %d", resp.StatusCode)
					}
				}
			}
			p := pollPoints(t, procs[1].base, uid, func(p shop.Points) bool { return len(p.Ledger) >= orders })
			time.Sleep(time.Second) // a second grant would show by now
			var rows, balance int64
			if err := db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(points), 0) FROM shop_points WHERE user_id = $1`, user).Scan(&rows, &balance); err != nil {
				t.Fatal(err)
			}
			if rows != orders || balance != orders*shop.PointsFor(1299) || p.Balance != balance {
				t.Fatalf("%d ledger rows, balance %d (API %d); want %d rows, %d points", rows, balance, p.Balance, orders, orders*shop.PointsFor(1299))
			}
			if n := payCount(t, db, postgresBackend, `SELECT COUNT(*) FROM idem_outbox WHERE topic = 'order.paid'`); n != orders {
				t.Errorf("%d order.paid events in the outbox, want %d", n, orders)
			}
			for _, p := range procs {
				p.stop()
			}
		})
	}
}

// Two shops on two databases (or one database dropped and re-created)
// publish through one NATS stream, the second within the stream's
// 2-minute de-duplication window of the first: both grant the points.
// Before, an event's ID was the prefix and its outbox row's id, so the
// second database's first events went out as shop-1 and shop-2, which
// the stream had seen from the first and dropped as duplicates: the
// second shop granted no point.
func TestShopdTwoDatabasesOneStreamGrantBoth(t *testing.T) {
	t.Parallel()
	url := testenv.NATS.Need(t)
	ns := brokerNamespace(t, testenv.NATS, url)
	seen := map[string]string{} // event ID → the shop that wrote it
	for _, name := range []string{"first", "second"} {
		db, dbArg := postgresBackend.fresh(t)
		user := 1 + rand.Int64N(1<<40)
		// One shop at a time: they share -events, so their consumers
		// would take each other's events.
		if !t.Run(name, func(t *testing.T) {
			base, _ := runShopd(t, "-addr", "127.0.0.1:0", "-db", dbArg, "-pay-secret", testPaySecret, "-broker", url, "-events", ns)
			payAndSeePoints(t, base, user)
		}) {
			return
		}
		var rows, balance int64
		if err := db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(points), 0) FROM shop_points WHERE user_id = $1`, user).Scan(&rows, &balance); err != nil {
			t.Fatal(err)
		}
		if rows != 2 || balance != 0 {
			t.Fatalf("%s shop: %d ledger rows, balance %d; want order.paid and order.refunded, 0", name, rows, balance)
		}
		// An event's ID: msg_id, or for a row an older shopd wrote, the
		// prefix and the row's id.
		for _, id := range idsOf(t, db, `SELECT COALESCE(msg_id, '`+shop.DefaultEventIDPrefix+`' || id) FROM idem_outbox ORDER BY id`) {
			if other, dup := seen[id]; dup {
				t.Fatalf("event ID %s written by the %s shop and the %s", id, other, name)
			}
			seen[id] = name
		}
	}
	if len(seen) != 4 {
		t.Fatalf("%d event IDs in the two outboxes, want 4", len(seen))
	}
}
