package shop_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// outboxEvents returns the events in the outbox about order orderNo, in
// the order they were added.
func outboxEvents(t *testing.T, db *sql.DB, b backend, orderNo string) []shop.OrderEvent {
	t.Helper()
	rows, err := db.Query(query(b, `SELECT topic, payload FROM idem_outbox WHERE msg_key = ? ORDER BY id`), orderNo)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var evs []shop.OrderEvent
	for rows.Next() {
		var topic string
		var payload []byte
		if err := rows.Scan(&topic, &payload); err != nil {
			t.Fatal(err)
		}
		var ev shop.OrderEvent
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatalf("payload %s: %v", payload, err)
		}
		if topic != ev.Event { // the relay adds the namespace when it publishes
			t.Errorf("event %s stored with the topic %q, want the event's name", ev.Event, topic)
		}
		if _, err := time.Parse(time.RFC3339, ev.At); err != nil {
			t.Errorf("event at %q: %v", ev.At, err)
		}
		evs = append(evs, ev)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

// wantEvents fails t unless the outbox holds exactly events about o, in
// this order, each with o's user and amount.
func wantEvents(t *testing.T, db *sql.DB, b backend, o shop.Order, events ...string) {
	t.Helper()
	got := outboxEvents(t, db, b, o.OrderNo)
	if len(got) != len(events) {
		t.Fatalf("outbox holds %d events about %s (%+v), want %v", len(got), o.OrderNo, got, events)
	}
	for i, ev := range got {
		if ev.Event != events[i] || ev.OrderNo != o.OrderNo || ev.UserID != o.UserID || ev.AmountCents != o.AmountCents {
			t.Errorf("event %d: %+v, want %s of order %s, user %d, %d cents", i, ev, events[i], o.OrderNo, o.UserID, o.AmountCents)
		}
	}
}

// deliverAll relays every pending event of s's outbox to the loyalty
// consumer's HandleTx, each one `times` times (a broker's redeliveries),
// and fails t unless each was processed once and a duplicate after.
func deliverAll(t *testing.T, s *shop.Shop, db *sql.DB, d sqlstore.Dialect, times int) {
	t.Helper()
	ctx := context.Background()
	store, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	in, err := inbox.New(store, &inbox.Config{Group: shop.LoyaltyGroup})
	if err != nil {
		t.Fatal(err)
	}
	publish := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
		msg := inbox.Message{ID: m.ID, Topic: m.Topic, Key: m.Key, Payload: m.Payload}
		for i := range times {
			o, err := in.HandleTx(ctx, db, msg, s.HandleLoyalty)
			if err != nil {
				return err
			}
			want := inbox.Duplicate
			if i == 0 {
				want = inbox.Processed
			}
			if o.Result != want {
				t.Errorf("delivery %d of %s (%s): %v (%v), want %v", i+1, m.ID, m.Topic, o.Result, o.Err, want)
			}
		}
		return nil
	})
	relay, err := outbox.NewRelay(s.Outbox(), publish, nil)
	if err != nil {
		t.Fatal(err)
	}
	for {
		n, err := relay.Once(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// getPoints reads GET /users/me/points for user.
func getPoints(t *testing.T, s http.Handler, user int64) shop.Points {
	t.Helper()
	rec := serve(s, "GET", "/users/me/points", map[string]string{"X-User-ID": strconv.FormatInt(user, 10)}, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /users/me/points: %d %s", rec.Code, rec.Body)
	}
	var p shop.Points
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	return p
}

// ledgerRows counts the ledger rows of order orderNo and event.
func ledgerRows(t *testing.T, db *sql.DB, b backend, orderNo, event string) int {
	t.Helper()
	return payCount(t, db, b, `SELECT COUNT(*) FROM shop_points WHERE order_no = ? AND event = ?`, orderNo, event)
}

func TestPointsFor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ cents, points int64 }{{0, 0}, {99, 0}, {100, 10}, {1299, 120}, {1300, 130}, {100000, 10000}} {
		if got := shop.PointsFor(c.cents); got != c.points {
			t.Errorf("PointsFor(%d) = %d, want %d", c.cents, got, c.points)
		}
	}
}

// Thirty concurrent duplicate payment callbacks write one order.paid, and
// the loyalty consumer grants its points once however often the event is
// delivered; refunds, repeated concurrently, write one order.refunded,
// which takes the points back once.
func TestPaidAndRefundedEventsGrantPointsOnce(t *testing.T) {
	forBackends(t, testPaidAndRefundedEventsGrantPointsOnce)
}

func testPaidAndRefundedEventsGrantPointsOnce(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	const user = 7
	o := placeOrder(t, s, user, 1) // SKU-1: 1299 cents
	wantEvents(t, db, b, o)
	if p := getPoints(t, s, user); p.Balance != 0 || len(p.Ledger) != 0 {
		t.Fatalf("points before paying: %+v, want none", p)
	}

	// Thirty concurrent callbacks of one trade.
	body := callbackBody(o.OrderNo, "T-"+o.OrderNo, o.AmountCents, "SUCCESS")
	sig := shop.SignPayment(testPaySecret, time.Now(), []byte(body))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 30 {
		wg.Go(func() {
			<-start
			if rec := callbackSigned(s, body, sig); rec.Code != http.StatusOK {
				t.Errorf("callback: %d %s", rec.Code, rec.Body)
			}
		})
	}
	close(start)
	wg.Wait()
	if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusPaid {
		t.Fatalf("order %+v, want PAID", got)
	}
	// Another trade of the same order: not applied (recorded for
	// reconciliation), no second event.
	callback(s, callbackBody(o.OrderNo, "T-second-"+o.OrderNo, o.AmountCents, "SUCCESS"))
	wantEvents(t, db, b, o, shop.EventOrderPaid)

	deliverAll(t, s, db, b.dialect, 3)
	want := shop.PointsFor(o.AmountCents)
	if want != 120 {
		t.Fatalf("order of %d cents earns %d points, want 120", o.AmountCents, want)
	}
	if n := ledgerRows(t, db, b, o.OrderNo, shop.EventOrderPaid); n != 1 {
		t.Errorf("%d ledger rows of order.paid, want 1", n)
	}
	p := getPoints(t, s, user)
	if p.Balance != want || len(p.Ledger) != 1 || p.Ledger[0].OrderNo != o.OrderNo || p.Ledger[0].Event != shop.EventOrderPaid || p.Ledger[0].Points != want {
		t.Fatalf("points after paying: %+v, want balance %d and one order.paid row", p, want)
	}
	if other := getPoints(t, s, user+1); other.Balance != 0 || len(other.Ledger) != 0 {
		t.Errorf("another user's points: %+v, want none", other)
	}
	// Delivering again (the relay has nothing pending) changes nothing.
	deliverAll(t, s, db, b.dialect, 1)

	// Eight concurrent refunds, two idempotency keys among them.
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() {
			h := map[string]string{"X-User-ID": strconv.Itoa(user), "Idempotency-Key": "refund-" + strconv.Itoa(i%2)}
			codes[i] = serve(s, "POST", "/orders/"+o.OrderNo+"/refunds", h, "").Code
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusCreated && c != http.StatusOK && c != http.StatusConflict {
			t.Errorf("refund %d: %d", i, c)
		}
	}
	wantEvents(t, db, b, o, shop.EventOrderPaid, shop.EventOrderRefunded)
	deliverAll(t, s, db, b.dialect, 3)
	if n := ledgerRows(t, db, b, o.OrderNo, shop.EventOrderRefunded); n != 1 {
		t.Errorf("%d ledger rows of order.refunded, want 1", n)
	}
	p = getPoints(t, s, user)
	if p.Balance != 0 || len(p.Ledger) != 2 || p.Ledger[1].Event != shop.EventOrderRefunded || p.Ledger[1].Points != -want {
		t.Fatalf("points after the refund: %+v, want balance 0, order.paid +%d then order.refunded -%d", p, want, want)
	}
}

// Cancelling and closing an order write their event once: repeated
// cancels, a close after a cancel, and a close job run twice write no
// second one; neither earns points.
func TestCancelAndCloseEventsOnce(t *testing.T) {
	forBackends(t, testCancelAndCloseEventsOnce)
}

func testCancelAndCloseEventsOnce(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	const user = 9
	cancelled := placeOrder(t, s, user, 1)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			rec := serve(s, "POST", "/orders/"+cancelled.OrderNo+"/cancel", map[string]string{"X-User-ID": strconv.Itoa(user)}, "")
			if rec.Code != http.StatusOK {
				t.Errorf("cancel: %d %s", rec.Code, rec.Body)
			}
		})
	}
	wg.Wait()
	wantEvents(t, db, b, cancelled, shop.EventOrderCancelled)

	unpaid := placeOrder(t, s, user, 2)
	mustExec(t, db, `UPDATE shop_orders SET created_ms = 1`)
	job, err := s.NewCloser(&shop.CloserConfig{PayTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer job.Close()
	for range 2 {
		if _, err := job.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	wantEvents(t, db, b, unpaid, shop.EventOrderClosed)
	wantEvents(t, db, b, cancelled, shop.EventOrderCancelled)

	deliverAll(t, s, db, b.dialect, 2)
	if p := getPoints(t, s, user); p.Balance != 0 || len(p.Ledger) != 0 {
		t.Errorf("points after a cancel and a close: %+v, want none", p)
	}
}

// A transition that rolls back leaves no event: a payment refused for its
// amount writes nothing to the outbox.
func TestRefusedPaymentWritesNoEvent(t *testing.T) {
	t.Parallel()
	b := sqliteBackend
	s, db := newPayShop(t, b)
	o := placeOrder(t, s, 3, 1)
	wantProblem(t, callback(s, callbackBody(o.OrderNo, "T-short", o.AmountCents-1, "SUCCESS")), http.StatusConflict, shop.CodeAmountMismatch)
	wantEvents(t, db, b, o)
}
