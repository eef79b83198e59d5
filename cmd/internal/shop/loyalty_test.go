package shop_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/sqlstore"
)

// loyaltyInbox returns the loyalty consumer's inbox on db, as shopd
// builds it.
func loyaltyInbox(t *testing.T, db *sql.DB, d sqlstore.Dialect) *inbox.Inbox {
	t.Helper()
	store, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	in, err := inbox.New(store, &inbox.Config{Group: shop.LoyaltyGroup, MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// orderEvents returns the events in db's outbox about order orderNo as
// the consumer would receive them, keyed by event name.
func orderEvents(t *testing.T, db *sql.DB, b backend, orderNo string) map[string]inbox.Message {
	t.Helper()
	rows, err := db.Query(query(b, `SELECT msg_id, topic, payload FROM idem_outbox WHERE msg_key = ? ORDER BY id`), orderNo)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	evs := map[string]inbox.Message{}
	for rows.Next() {
		var m inbox.Message
		if err := rows.Scan(&m.ID, &m.Topic, &m.Payload); err != nil {
			t.Fatal(err)
		}
		var ev shop.OrderEvent
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		m.Key = orderNo
		evs[ev.Event] = m
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

// payAndRefund places an order of SKU-1 for user, pays it and refunds
// it, and returns it.
func payAndRefund(t *testing.T, s *shop.Shop, user int64) shop.Order {
	t.Helper()
	o := placeOrder(t, s, user, 1)
	wantSuccess(t, callback(s, callbackBody(o.OrderNo, "T-"+o.OrderNo, o.AmountCents, "SUCCESS")))
	h := map[string]string{"X-User-ID": strconv.FormatInt(user, 10), "Idempotency-Key": "refund-" + o.OrderNo}
	if rec := serve(s, "POST", "/orders/"+o.OrderNo+"/refunds", h, ""); rec.Code != http.StatusCreated {
		t.Fatalf("refund: %d %s", rec.Code, rec.Body)
	}
	return o
}

// An event read before the one it follows — order.refunded handled while
// order.paid waits for its redelivery (its first attempt failed, it was
// naked behind later messages, another worker took the refund) — must not
// leave the user with a negative balance, nor grant the order's points
// once the order is refunded. Also concurrently: the two handled at once
// by two workers end with a balance of 0.
func TestLoyaltyRefundBeforePaid(t *testing.T) {
	forBackends(t, testLoyaltyRefundBeforePaid)
}

func testLoyaltyRefundBeforePaid(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	in := loyaltyInbox(t, db, b.dialect)
	ctx := context.Background()
	const user = 11
	o := payAndRefund(t, s, user)
	evs := orderEvents(t, db, b, o.OrderNo)
	paid, refunded := evs[shop.EventOrderPaid], evs[shop.EventOrderRefunded]
	if paid.ID == "" || refunded.ID == "" {
		t.Fatalf("outbox events of %s: %+v", o.OrderNo, evs)
	}
	handle := func(m inbox.Message) {
		t.Helper()
		out, err := in.HandleTx(ctx, db, m, s.HandleLoyalty)
		if err != nil || out.Result != inbox.Processed {
			t.Fatalf("%s: %v %v (%v)", m.Topic, out.Result, err, out.Err)
		}
	}
	handle(refunded)
	if p := getPoints(t, s, user); p.Balance < 0 {
		t.Errorf("balance after the refund, before the payment's event: %d (ledger %+v), want no negative balance", p.Balance, p.Ledger)
	}
	handle(paid)
	if p := getPoints(t, s, user); p.Balance != 0 {
		t.Errorf("balance of a refunded order's user after both events: %d (ledger %+v), want 0", p.Balance, p.Ledger)
	}

	// Both at once, many times over: never a balance other than 0 once
	// both are handled.
	for i := range 10 {
		u := int64(100 + i)
		o := payAndRefund(t, s, u)
		evs := orderEvents(t, db, b, o.OrderNo)
		var wg sync.WaitGroup
		for _, m := range []inbox.Message{evs[shop.EventOrderRefunded], evs[shop.EventOrderPaid]} {
			wg.Go(func() {
				for {
					out, err := in.HandleTx(ctx, db, m, s.HandleLoyalty)
					if err == nil && out.Result == inbox.Processed {
						return
					}
					if err == nil && out.Result != inbox.Retry {
						t.Errorf("%s: %v (%v)", m.Topic, out.Result, out.Err)
						return
					}
					time.Sleep(10 * time.Millisecond) // a serialisation failure: the redelivery
				}
			})
		}
		wg.Wait()
		if p := getPoints(t, s, u); p.Balance != 0 {
			t.Errorf("user %d: balance %d after order.paid and order.refunded handled at once (ledger %+v), want 0", u, p.Balance, p.Ledger)
		}
	}
}

// Events on the shop's subjects from another producer (a misconfigured
// service, a replayed dead letter edited by hand, an attacker with access
// to the broker) are not taken on their word: an order.paid for an order
// the shop does not have, for an order not paid, for another user or for
// another amount grants nothing, and a forged one that arrives first does
// not keep the genuine event from granting the order's real points.
func TestLoyaltyForeignEvents(t *testing.T) {
	forBackends(t, testLoyaltyForeignEvents)
}

func testLoyaltyForeignEvents(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	in := loyaltyInbox(t, db, b.dialect)
	ctx := context.Background()
	const user, other = 21, 22
	at := time.Now().UTC().Format(time.RFC3339)
	forged := func(id string, ev shop.OrderEvent) inbox.Message {
		ev.At = at
		p, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		return inbox.Message{ID: id, Topic: shop.EventTopic("shop", ev.Event), Key: ev.OrderNo, Payload: p}
	}
	unpaid := placeOrder(t, s, user, 1)
	paidOrder := placeOrder(t, s, user, 1)
	wantSuccess(t, callback(s, callbackBody(paidOrder.OrderNo, "T-"+paidOrder.OrderNo, paidOrder.AmountCents, "SUCCESS")))

	for _, m := range []inbox.Message{
		forged("forged-none", shop.OrderEvent{OrderNo: "NO-SUCH-ORDER", UserID: user, AmountCents: 1 << 40, Event: shop.EventOrderPaid}),
		forged("forged-unpaid", shop.OrderEvent{OrderNo: unpaid.OrderNo, UserID: user, AmountCents: unpaid.AmountCents, Event: shop.EventOrderPaid}),
		forged("forged-user", shop.OrderEvent{OrderNo: paidOrder.OrderNo, UserID: other, AmountCents: paidOrder.AmountCents, Event: shop.EventOrderPaid}),
		forged("forged-amount", shop.OrderEvent{OrderNo: paidOrder.OrderNo, UserID: user, AmountCents: 1 << 40, Event: shop.EventOrderPaid}),
		forged("forged-refund", shop.OrderEvent{OrderNo: paidOrder.OrderNo, UserID: user, AmountCents: paidOrder.AmountCents, Event: shop.EventOrderRefunded}),
	} {
		out, err := in.HandleTx(ctx, db, m, s.HandleLoyalty)
		if err != nil {
			t.Fatal(err)
		}
		if out.Result == inbox.Processed {
			t.Errorf("forged %s (%s) processed, want it refused", m.ID, m.Payload)
		}
	}
	for _, u := range []int64{user, other} {
		if p := getPoints(t, s, u); p.Balance != 0 || len(p.Ledger) != 0 {
			t.Errorf("user %d after forged events: %+v, want no points", u, p)
		}
	}

	// The genuine order.paid still grants the order's points.
	evs := orderEvents(t, db, b, paidOrder.OrderNo)
	out, err := in.HandleTx(ctx, db, evs[shop.EventOrderPaid], s.HandleLoyalty)
	if err != nil || out.Result != inbox.Processed {
		t.Fatalf("genuine order.paid: %v %v (%v)", out.Result, err, out.Err)
	}
	if p, want := getPoints(t, s, user), shop.PointsFor(paidOrder.AmountCents); p.Balance != want || len(p.Ledger) != 1 {
		t.Errorf("user %d after the genuine order.paid: %+v, want %d points in one row", user, p, want)
	}
}

// GET /users/me/points with a hostile X-User-ID answers 401 and shows no
// one's points: not a user whose decimal form the value resembles (a
// sign, a leading zero, spaces, an overflow, a list).
func TestPointsHostileUserIDs(t *testing.T) {
	t.Parallel()
	s, db := newPayShop(t, sqliteBackend)
	in := loyaltyInbox(t, db, sqlstore.SQLite)
	o := placeOrder(t, s, 1, 1)
	wantSuccess(t, callback(s, callbackBody(o.OrderNo, "T-"+o.OrderNo, o.AmountCents, "SUCCESS")))
	m := orderEvents(t, db, sqliteBackend, o.OrderNo)[shop.EventOrderPaid]
	if out, err := in.HandleTx(context.Background(), db, m, s.HandleLoyalty); err != nil || out.Result != inbox.Processed {
		t.Fatalf("order.paid: %v %v (%v)", out.Result, err, out.Err)
	}
	if p := getPoints(t, s, 1); p.Balance != shop.PointsFor(o.AmountCents) {
		t.Fatalf("user 1's points: %+v", p)
	}
	for _, id := range []string{"", "0", "-1", "+1", "01", " 1", "1 ", "1,2", "0x1", "1e0", "9223372036854775808", "18446744073709551617", "1\x00", "١"} {
		rec := serve(s, "GET", "/users/me/points", map[string]string{"X-User-ID": id}, "")
		if rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), o.OrderNo) {
			t.Errorf("X-User-ID %q: %d %s, want 401 without the ledger", id, rec.Code, rec.Body)
		}
	}
}

// The order.paid events of 40 orders handled by 8 workers at once (the
// loyalty consumer has 4, and shopd processes share it): each is
// processed on its first attempt — on MySQL a locking read of the ledger
// took gap locks, and events of different orders whose rows fall in one
// gap deadlocked at their inserts, each deadlock a failed attempt — and
// each user has the order's points once.
func TestLoyaltyConcurrentOrders(t *testing.T) {
	forBackends(t, testLoyaltyConcurrentOrders)
}

func testLoyaltyConcurrentOrders(t *testing.T, b backend) {
	s, db := newPayShop(t, b)
	in := loyaltyInbox(t, db, b.dialect)
	const orders = 40
	var msgs []inbox.Message
	var amount int64
	for i := range orders {
		o := placeOrder(t, s, int64(500+i), 1)
		wantSuccess(t, callback(s, callbackBody(o.OrderNo, "T-"+o.OrderNo, o.AmountCents, "SUCCESS")))
		msgs = append(msgs, orderEvents(t, db, b, o.OrderNo)[shop.EventOrderPaid])
		amount = o.AmountCents
	}
	work := make(chan inbox.Message)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for m := range work {
				out, err := in.HandleTx(context.Background(), db, m, s.HandleLoyalty)
				if err != nil || out.Result != inbox.Processed {
					t.Errorf("%s: %v %v (%v), want processed on the first attempt", m.ID, out.Result, err, out.Err)
				}
			}
		})
	}
	for _, m := range msgs {
		work <- m
	}
	close(work)
	wg.Wait()
	for i := range orders {
		if p := getPoints(t, s, int64(500+i)); p.Balance != shop.PointsFor(amount) || len(p.Ledger) != 1 {
			t.Errorf("user %d: %+v, want %d points in one row", 500+i, p, shop.PointsFor(amount))
		}
	}
}
