package shop_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/internal/testenv"
)

// The brokers of the killed-process tests: the embedded NATS server (the
// killed shopd's own, started again on its -nats-store), the machine's
// NATS server and its RabbitMQ.
var killBrokers = []struct {
	name string
	svc  *testenv.Service // nil: embedded
}{{"embedded", nil}, {"nats", &testenv.NATS}, {"rabbitmq", &testenv.RabbitMQ}}

// A shopd process killed with SIGKILL after the broker confirmed an
// order.paid and before its relay marked the outbox row sent: the row is
// still pending, the shopd started in its place publishes it again with
// the same ID, and the points are granted once (one ledger row, the
// balance of one payment), whichever process consumed it.
func TestShopdKilledBeforeMarkRepublishes(t *testing.T) {
	t.Parallel()
	for _, b := range killBrokers {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			k := newKillCase(t, b.svc)
			first := k.spawn("publish")
			o := k.payOrder(first)
			id := waitFor(t, first.out, regexp.MustCompile(`(?m)^published (\S+) \S+\.order\.paid$`))[1]
			k.kill(first)
			if n := payCount(t, k.db, postgresBackend, `SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL AND id = $1`, k.row(id)); n != 1 {
				t.Fatalf("the outbox row of %s is not pending after the kill", id)
			}

			second := k.spawn("")
			waitFor(t, second.out, regexp.MustCompile(`(?m)^published `+regexp.QuoteMeta(id)+` `))
			k.waitSent(id)
			if b.svc != nil && b.svc.Name == testenv.RabbitMQ.Name {
				// RabbitMQ keeps both copies: the second is a duplicate.
				waitFor(t, second.out, regexp.MustCompile(`(?m)^handled `+regexp.QuoteMeta(id)+` duplicate$`))
			}
			k.waitSettled(second)
			k.wantPointsOnce(o)
			second.stop()
		})
	}
}

// A shopd process killed with SIGKILL after its loyalty consumer committed
// an order.paid's points and before the ack: the broker delivers the
// event again, to the shopd started in its place, whose consumer finds it
// handled (a duplicate) and acks it; the points are granted once.
func TestShopdKilledBeforeAckPointsOnce(t *testing.T) {
	t.Parallel()
	for _, b := range killBrokers {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			k := newKillCase(t, b.svc)
			first := k.spawn("commit")
			o := k.payOrder(first)
			id := waitFor(t, first.out, regexp.MustCompile(`(?m)^handled (\S+) processed$`))[1]
			k.wantLedger(o, 1) // committed before the kill
			k.kill(first)

			second := k.spawn("")
			waitFor(t, second.out, regexp.MustCompile(`(?m)^handled `+regexp.QuoteMeta(id)+` duplicate$`))
			k.waitSettled(second)
			k.wantPointsOnce(o)
			var status string
			var attempts int
			if err := k.db.QueryRow(`SELECT status, attempts FROM idem_inbox WHERE message_id = $1 AND consumer_group = $2`, id, shop.LoyaltyGroup).Scan(&status, &attempts); err != nil {
				t.Fatal(err)
			}
			if status != "succeeded" || attempts != 1 {
				t.Errorf("consume record of %s: %s after %d attempts, want succeeded after 1", id, status, attempts)
			}
			second.stop()
		})
	}
}

// killCase is a shop on a PostgreSQL database of its own, its shopd
// processes on one broker and one embedded NATS store.
type killCase struct {
	t    *testing.T
	db   *sql.DB
	args []string
	// events is -events; natsURL the NATS server's (empty: the embedded
	// one's, which shopd prints; or RabbitMQ).
	events, natsURL string
	amqp            bool
	user            int64
}

func newKillCase(t *testing.T, svc *testenv.Service) *killCase {
	t.Helper()
	db, dbArg := postgresBackend.fresh(t)
	k := &killCase{t: t, db: db, events: shop.DefaultEvents, user: 1 + rand.Int64N(1<<40)}
	k.args = []string{"-db", dbArg, "-pay-secret", testPaySecret, "-nats-store", filepath.Join(t.TempDir(), "nats")}
	if svc != nil {
		url := svc.Need(t)
		k.events = brokerNamespace(t, *svc, url)
		k.args = append(k.args, "-broker", url, "-events", k.events)
		if svc.Name == testenv.NATS.Name {
			k.natsURL = url
		} else {
			k.amqp = true
		}
	}
	return k
}

// spawn starts shopd, tracing its publishes and consumes, hanging at hang
// ("publish", "commit" or ""), with a 2 s AckWait, and waits until it
// listens.
func (k *killCase) spawn(hang string) *shopd {
	k.t.Helper()
	s := spawnShopdEnv(k.t, []string{envTrace + "=1", envHang + "=" + hang, envAckWait + "=2s"}, k.args...)
	s.ready()
	return s
}

// kill kills s with SIGKILL and waits until it is gone.
func (k *killCase) kill(s *shopd) {
	k.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		k.t.Fatal(err)
	}
	<-s.done
}

// payOrder places an order of one SKU-1 through s and pays it with one
// signed callback.
func (k *killCase) payOrder(s *shopd) shop.Order {
	k.t.Helper()
	uid := strconv.FormatInt(k.user, 10)
	r := do(k.t, "POST", s.base+"/orders", uid, "kill-"+uid, `{"sku":"SKU-1","quantity":1}`)
	if r.status != http.StatusCreated {
		k.t.Fatalf("create order: %d %s", r.status, r.body)
	}
	var o shop.Order
	if err := json.Unmarshal(r.body, &o); err != nil {
		k.t.Fatal(err)
	}
	body := []byte(callbackBody(o.OrderNo, "T-"+o.OrderNo, o.AmountCents, "SUCCESS"))
	req, _ := http.NewRequest("POST", s.base+"/payments/callback", bytes.NewReader(body))
	req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(testPaySecret, time.Now(), body))
	resp, err := client.Do(req)
	if err != nil {
		k.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		k.t.Fatalf("callback: %d", resp.StatusCode)
	}
	return o
}

// row is the outbox row id of the event ID id.
func (k *killCase) row(id string) int64 {
	k.t.Helper()
	var n int64
	if err := k.db.QueryRow(`SELECT id FROM idem_outbox WHERE msg_id = $1`, id).Scan(&n); err != nil {
		k.t.Fatalf("event ID %q: %v", id, err)
	}
	return n
}

// waitSent waits until the outbox row of id is marked sent.
func (k *killCase) waitSent(id string) {
	k.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if payCount(k.t, k.db, postgresBackend, `SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NOT NULL AND id = $1`, k.row(id)) == 1 {
			return
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("the outbox row of %s is not sent after 20s", id)
		}
	}
}

// waitSettled waits until nothing is left for the loyalty consumer of s:
// no outbox row pending, and on NATS no message of its durable pending or
// awaiting its ack (RabbitMQ's callers wait for the deliveries they
// expect).
func (k *killCase) waitSettled(s *shopd) {
	k.t.Helper()
	url := k.natsURL
	if !k.amqp && url == "" {
		url = waitFor(k.t, s.out, regexp.MustCompile(`events: embedded NATS JetStream (nats://\S+)`))[1]
	}
	var js jetstream.JetStream
	if !k.amqp {
		nc, err := nats.Connect(url)
		if err != nil {
			k.t.Fatal(err)
		}
		defer nc.Close()
		if js, err = jetstream.New(nc); err != nil {
			k.t.Fatal(err)
		}
	}
	streams, _, queues := shop.BrokerNames(k.events)
	last := ""
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pending := payCount(k.t, k.db, postgresBackend, `SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL`)
		settled := pending == 0
		last = fmt.Sprintf("%d outbox rows pending", pending)
		if settled && js != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			info, err := js.Consumer(ctx, streams[0], queues[0])
			cancel()
			if err != nil {
				k.t.Fatalf("consumer %s: %v", queues[0], err)
			}
			settled = info.CachedInfo().NumPending == 0 && info.CachedInfo().NumAckPending == 0
			last = fmt.Sprintf("consumer %s: %d pending, %d awaiting the ack", queues[0], info.CachedInfo().NumPending, info.CachedInfo().NumAckPending)
		}
		if settled {
			return
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("not settled after 20s: %s", last)
		}
	}
}

// wantLedger fails the test unless the ledger holds n rows of o's user.
func (k *killCase) wantLedger(o shop.Order, n int) {
	k.t.Helper()
	if got := payCount(k.t, k.db, postgresBackend, `SELECT COUNT(*) FROM shop_points WHERE user_id = $1`, o.UserID); got != n {
		k.t.Fatalf("%d ledger rows of user %d, want %d", got, o.UserID, n)
	}
}

// wantPointsOnce fails the test unless o's payment was granted once: one
// ledger row, of order.paid, and the balance of one payment.
func (k *killCase) wantPointsOnce(o shop.Order) {
	k.t.Helper()
	var rows, balance int64
	if err := k.db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(points), 0) FROM shop_points WHERE user_id = $1 AND order_no = $2 AND event = $3`,
		o.UserID, o.OrderNo, shop.EventOrderPaid).Scan(&rows, &balance); err != nil {
		k.t.Fatal(err)
	}
	if want := shop.PointsFor(o.AmountCents); rows != 1 || balance != want {
		k.t.Fatalf("%d ledger rows, balance %d; want 1 row of %d points", rows, balance, want)
	}
	k.wantLedger(o, 1)
}
