package killsoak_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// settle waits until the shop is at rest: no order left waiting for its
// payment (the close job closed them), every event in the outbox sent
// and handled by the loyalty consumer, nothing pending or awaiting an
// ack on the broker. A killed consumer's unacked messages come back
// after the durable's AckWait (30 s).
func (r *rig) settle(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	js, closeJS, err := jetStream(r.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer closeJS()
	last := ""
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		var waiting, pending, unhandled, dead int
		r.db.QueryRow(`SELECT COUNT(*) FROM shop_orders WHERE status = 'WAIT_PAY'`).Scan(&waiting)
		r.db.QueryRow(`SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&pending)
		r.db.QueryRow(`SELECT COUNT(*) FROM idem_outbox o WHERE NOT EXISTS (SELECT 1 FROM idem_inbox i
			WHERE i.message_id = o.msg_id AND i.consumer_group = $1 AND i.status = 'succeeded')`, shop.LoyaltyGroup).Scan(&unhandled)
		r.db.QueryRow(`SELECT COUNT(*) FROM idem_inbox WHERE status = 'dead'`).Scan(&dead)
		last = fmt.Sprintf("%d orders waiting, %d events pending, %d not handled, %d dead", waiting, pending, unhandled, dead)
		if dead > 0 {
			t.Errorf("not settling: %s", last)
			return time.Since(start)
		}
		if waiting+pending+unhandled == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := js.Consumer(ctx, streamOf(r.events), durableOf(r.events))
			cancel()
			if err == nil && c.CachedInfo().NumPending == 0 && c.CachedInfo().NumAckPending == 0 {
				return time.Since(start)
			}
			if err == nil {
				last += fmt.Sprintf("; consumer: %d pending, %d awaiting the ack", c.CachedInfo().NumPending, c.CachedInfo().NumAckPending)
			} else {
				last += fmt.Sprintf("; consumer: %v", err)
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("not settled after 3m: %s", last)
			return time.Since(start)
		}
	}
}

// effects are the figures of what the database holds after the run.
type effects struct {
	orders                                      int
	byStatus                                    map[string]int
	payments, refunds, claims, tokensUsed       int
	events, handled, streamMsgs, deadLetters    int
	doubled, lost                               int
	reconciliations, ledgerRows, couponsClaimed int
}

func (e effects) String() string {
	var st []string
	for s, n := range e.byStatus {
		st = append(st, fmt.Sprintf("%s %d", s, n))
	}
	sort.Strings(st)
	return fmt.Sprintf("%d orders (%s); %d payments, %d refunds, %d reconciliations; %d coupon claims (%d of the total taken); %d tokens spent; %d ledger rows; %d events written, %d handled, %d messages on the stream, %d dead letters; %d doubled effects, %d lost",
		e.orders, strings.Join(st, ", "), e.payments, e.refunds, e.reconciliations, e.claims, e.couponsClaimed, e.tokensUsed,
		e.ledgerRows, e.events, e.handled, e.streamMsgs, e.deadLetters, e.doubled, e.lost)
}

type dbOrder struct {
	no, sku, status    string
	user, qty, reserve int64
	amount             int64
	coupon             sql.NullInt64
}

var orderNoRE = regexp.MustCompile(`ord_[0-9a-zA-Z]+`)

// check reads the database in one snapshot and fails t for every broken
// invariant; it returns the figures.
func (r *rig) check(t *testing.T, led *ledger) effects {
	t.Helper()
	tx, err := r.db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	return r.checkIn(t, tx, led)
}

// checkIn is check reading in tx.
func (r *rig) checkIn(t testing.TB, tx *sql.Tx, led *ledger) effects {
	t.Helper()
	ctx := context.Background()
	e := effects{byStatus: map[string]int{}}
	errs := 0
	fail := func(doubled, lost bool, format string, args ...any) {
		if doubled {
			e.doubled++
		}
		if lost {
			e.lost++
		}
		if errs++; errs <= 40 {
			t.Errorf(format, args...)
		}
	}
	query := func(q string, scan func(*sql.Rows) error, args ...any) {
		t.Helper()
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	orders := map[string]*dbOrder{}
	query(`SELECT order_no, user_id, sku, quantity, reserved_qty, amount_cents, coupon_id, status FROM shop_orders`, func(rs *sql.Rows) error {
		o := &dbOrder{}
		err := rs.Scan(&o.no, &o.user, &o.sku, &o.qty, &o.reserve, &o.amount, &o.coupon, &o.status)
		orders[o.no] = o
		e.byStatus[o.status]++
		return err
	})
	e.orders = len(orders)
	live := func(o *dbOrder) bool {
		return o.status == shop.StatusWaitPay || o.status == shop.StatusPaid || o.status == shop.StatusRefunding || o.status == shop.StatusRefunded
	}

	// One order per Idempotency-Key: every order is named by exactly one
	// completed record of an order key, every 201 record names an order.
	namedBy := map[string][]string{}
	recordOf := map[string]string{} // key → the order its 201 names
	statusOf := map[string]int{}    // key → the stored status
	query(`SELECT idempotency_key, status, COALESCE(response_status, 0), COALESCE(response_body, ''::bytea) FROM idem_records WHERE idempotency_key LIKE 'o-%'`, func(rs *sql.Rows) error {
		var key, status string
		var code int
		var body []byte
		if err := rs.Scan(&key, &status, &code, &body); err != nil {
			return err
		}
		if status != "completed" {
			return nil
		}
		statusOf[key] = code
		if code == 201 {
			var o shop.Order
			if json.Unmarshal(body, &o) != nil || o.OrderNo == "" {
				fail(false, true, "record %s: 201 without an order: %.200s", key, body)
				return nil
			}
			recordOf[key] = o.OrderNo
			namedBy[o.OrderNo] = append(namedBy[o.OrderNo], key)
		}
		return nil
	})
	for no := range orders {
		switch keys := namedBy[no]; len(keys) {
		case 1:
		case 0:
			fail(true, false, "order %s: no idempotency record names it (an effect without its answer)", no)
		default:
			fail(true, false, "order %s: named by the records of %d keys %q", no, len(keys), keys)
		}
	}
	for key, no := range recordOf {
		if orders[no] == nil {
			fail(false, true, "record %s answered 201 with order %s, which the database does not have", key, no)
		}
	}
	for key, want := range led.orders {
		o := orders[want.orderNo]
		switch {
		case recordOf[key] != want.orderNo:
			fail(false, true, "key %s: the client was answered %s, the record names %q", key, want.orderNo, recordOf[key])
		case o == nil:
			fail(false, true, "key %s: order %s answered 201 is not in the database", key, want.orderNo)
		case o.user != want.user || o.sku != want.sku || o.qty != int64(want.quantity):
			fail(false, false, "key %s: order %+v, the client asked %+v", key, *o, want)
		}
	}
	for key, status := range led.refused {
		if got, ok := statusOf[key]; ok && got != status {
			fail(false, false, "key %s: the client was answered %d, the record holds %d", key, status, got)
		}
	}

	// Stock conserved: what the catalogue started with is in stock or in
	// a live order; every order reserved its quantity.
	reserved := map[string]int64{}
	for _, o := range orders {
		if o.reserve != o.qty {
			fail(false, false, "order %s: reserved %d of %d", o.no, o.reserve, o.qty)
		}
		if live(o) {
			reserved[o.sku] += o.reserve
		}
	}
	for _, p := range catalog.Products {
		var stock int64
		if err := tx.QueryRowContext(ctx, `SELECT stock FROM shop_products WHERE sku = $1`, p.SKU).Scan(&stock); err != nil {
			t.Fatal(err)
		}
		if stock+reserved[p.SKU] != p.Stock {
			fail(true, false, "%s: %d in stock + %d in live orders = %d, the catalogue had %d", p.SKU, stock, reserved[p.SKU], stock+reserved[p.SKU], p.Stock)
		}
	}

	// One payment per paid order, of its amount.
	paymentsOf := map[string][]string{}
	tradeOrder := map[string]string{}
	query(`SELECT trade_no, order_no, amount_cents FROM shop_payments`, func(rs *sql.Rows) error {
		var trade, no string
		var amount int64
		err := rs.Scan(&trade, &no, &amount)
		paymentsOf[no] = append(paymentsOf[no], trade)
		tradeOrder[trade] = no
		if o := orders[no]; o != nil && o.amount != amount {
			fail(false, false, "payment %s of %d for order %s of %d", trade, amount, no, o.amount)
		}
		e.payments++
		return err
	})
	for no, o := range orders {
		paid := o.status == shop.StatusPaid || o.status == shop.StatusRefunding || o.status == shop.StatusRefunded
		switch n := len(paymentsOf[no]); {
		case paid && n == 0:
			fail(false, true, "order %s is %s without a payment", no, o.status)
		case paid && n > 1:
			fail(true, false, "order %s has %d payments %q", no, n, paymentsOf[no])
		case !paid && n > 0:
			fail(true, false, "order %s is %s with payments %q", no, o.status, paymentsOf[no])
		}
	}
	for no := range paymentsOf {
		if orders[no] == nil {
			fail(true, false, "payments %q of order %s, which the database does not have", paymentsOf[no], no)
		}
	}
	reconciled := map[string]bool{}
	query(`SELECT trade_no FROM shop_reconciliations`, func(rs *sql.Rows) error {
		var trade string
		e.reconciliations++
		err := rs.Scan(&trade)
		reconciled[trade] = true
		return err
	})
	for trade, no := range led.paid {
		if tradeOrder[trade] != no {
			fail(false, true, "trade %s answered 200: payment row names order %q, want %s", trade, tradeOrder[trade], no)
		}
	}
	for trade, no := range led.unpayable {
		if o := orders[no]; o == nil || (o.status != shop.StatusCancelled && o.status != shop.StatusClosed) || !reconciled[trade] || tradeOrder[trade] != "" {
			fail(false, false, "trade %s answered 409: order %s %+v, reconciled %v, payment %q", trade, no, o, reconciled[trade], tradeOrder[trade])
		}
	}

	// Refunds: one per refunded order, the one the client was told of.
	refundOf := map[string]string{}
	query(`SELECT order_no, refund_no FROM shop_refunds`, func(rs *sql.Rows) error {
		var no, ref string
		err := rs.Scan(&no, &ref)
		refundOf[no] = ref
		e.refunds++
		return err
	})
	for no, o := range orders {
		// A REFUNDING order (its refund's provider step not ended when
		// the traffic stopped) has its refund row too.
		if (o.status == shop.StatusRefunded || o.status == shop.StatusRefunding) != (refundOf[no] != "") {
			fail(refundOf[no] != "", refundOf[no] == "", "order %s is %s, refund %q", no, o.status, refundOf[no])
		}
	}
	for no, ref := range led.refunds {
		if refundOf[no] != ref {
			fail(false, true, "refund of %s answered %s, the database has %q", no, ref, refundOf[no])
		}
	}
	for no := range led.cancelled {
		if o := orders[no]; o == nil || o.status != shop.StatusCancelled {
			fail(false, true, "order %s answered cancelled is %+v", no, o)
		}
	}

	// Coupons: claims within the total, counted once; a claim used by a
	// live order names it, and every live order with the coupon has its
	// claim.
	var claimed, total int64
	if err := tx.QueryRowContext(ctx, `SELECT claimed, total FROM shop_coupons WHERE id = 1`).Scan(&claimed, &total); err != nil {
		t.Fatal(err)
	}
	e.couponsClaimed = int(claimed)
	claimUsedBy := map[int64]string{}
	claimUsers := map[int64]bool{}
	query(`SELECT user_id, status, COALESCE(order_no, '') FROM shop_coupon_claims WHERE coupon_id = 1`, func(rs *sql.Rows) error {
		var user int64
		var status, no string
		err := rs.Scan(&user, &status, &no)
		e.claims++
		claimUsers[user] = true
		switch {
		case status == "USED" && (orders[no] == nil || !live(orders[no]) || orders[no].user != user || orders[no].coupon.Int64 != 1):
			fail(true, false, "claim of user %d is used by %q, which is not a live order of its with the coupon", user, no)
		case status == "USED":
			claimUsedBy[user] = no
		case no != "":
			fail(false, false, "claim of user %d is %s and names %s", user, status, no)
		}
		return err
	})
	if int64(e.claims) != claimed || claimed > total {
		fail(true, false, "coupon 1: %d claims, %d counted, total %d", e.claims, claimed, total)
	}
	for no, o := range orders {
		if o.coupon.Valid && live(o) && claimUsedBy[o.user] != no {
			fail(true, false, "order %s uses the coupon; user %d's claim is used by %q", no, o.user, claimUsedBy[o.user])
		}
	}
	for user := range led.claims {
		if !claimUsers[user] {
			fail(false, true, "user %d was answered a claim the database does not have", user)
		}
	}

	// Submit tokens: a spent token names one order, an order is named by
	// at most one token, and every token order the client was told of is
	// named.
	tokenOrders := map[string]int{}
	query(`SELECT result FROM idem_tokens WHERE used_at IS NOT NULL`, func(rs *sql.Rows) error {
		var result []byte
		err := rs.Scan(&result)
		e.tokensUsed++
		no := orderNoRE.FindString(string(result))
		if orders[no] == nil {
			fail(false, true, "a spent token names %q (%.100q), which is no order", no, result)
		}
		tokenOrders[no]++
		return err
	})
	for no, n := range tokenOrders {
		if n > 1 {
			fail(true, false, "order %s is named by %d spent tokens", no, n)
		}
	}
	for tok, no := range led.tokens {
		if tokenOrders[no] != 1 {
			fail(false, true, "token %.8s… created %s; spent tokens naming it: %d", tok, no, tokenOrders[no])
		}
	}

	// Events: one per transition, each sent, handled once by the loyalty
	// consumer; the points granted once per paid order and taken back
	// once per refund.
	eventsOf := map[string][]string{}
	msgIDs := map[string]bool{}
	query(`SELECT topic, COALESCE(msg_id, ''), payload, sent_at IS NOT NULL FROM idem_outbox`, func(rs *sql.Rows) error {
		var topic, id string
		var payload []byte
		var sent bool
		err := rs.Scan(&topic, &id, &payload, &sent)
		e.events++
		var ev shop.OrderEvent
		json.Unmarshal(payload, &ev)
		eventsOf[ev.OrderNo] = append(eventsOf[ev.OrderNo], ev.Event)
		msgIDs[id] = true
		if !sent {
			fail(false, true, "event %s (%s of %s) was never sent", id, ev.Event, ev.OrderNo)
		}
		return err
	})
	for no, o := range orders {
		want := map[string][]string{
			shop.StatusWaitPay: nil, shop.StatusPaid: {shop.EventOrderPaid}, shop.StatusRefunding: {shop.EventOrderPaid}, shop.StatusCancelled: {shop.EventOrderCancelled},
			shop.StatusClosed: {shop.EventOrderClosed}, shop.StatusRefunded: {shop.EventOrderPaid, shop.EventOrderRefunded},
		}[o.status]
		got := eventsOf[no]
		sort.Strings(got)
		if strings.Join(got, " ") != strings.Join(want, " ") {
			fail(len(got) > len(want), len(got) < len(want), "order %s (%s): events %q, want %q", no, o.status, got, want)
		}
	}
	query(`SELECT message_id, status FROM idem_inbox WHERE consumer_group = $1`, func(rs *sql.Rows) error {
		var id, status string
		err := rs.Scan(&id, &status)
		switch {
		case !msgIDs[id]:
			fail(false, false, "the consumer handled %s, which is no event of the outbox", id)
		case status != "succeeded":
			fail(false, true, "event %s: consume record %s", id, status)
		default:
			e.handled++
			delete(msgIDs, id)
		}
		return err
	}, shop.LoyaltyGroup)
	for id := range msgIDs {
		fail(false, true, "event %s was never handled", id)
	}
	type grant struct{ paid, refunded, rows int64 }
	points := map[string]*grant{}
	query(`SELECT order_no, event, points FROM shop_points`, func(rs *sql.Rows) error {
		var no, event string
		var p int64
		err := rs.Scan(&no, &event, &p)
		e.ledgerRows++
		g := points[no]
		if g == nil {
			g = &grant{}
			points[no] = g
		}
		g.rows++
		if event == shop.EventOrderPaid {
			g.paid = p
		} else {
			g.refunded = p
		}
		return err
	})
	for no, o := range orders {
		g := points[no]
		if g == nil {
			g = &grant{}
		}
		switch o.status {
		case shop.StatusPaid, shop.StatusRefunding:
			if g.rows != 1 || g.paid != shop.PointsFor(o.amount) {
				fail(g.rows > 1, g.rows < 1, "order %s (PAID, %d cents): ledger %+v, want one grant of %d", no, o.amount, *g, shop.PointsFor(o.amount))
			}
		case shop.StatusRefunded:
			if g.rows != 2 || g.paid+g.refunded != 0 || (g.paid != shop.PointsFor(o.amount) && g.paid != 0) {
				fail(g.rows > 2, g.rows < 2, "order %s (REFUNDED, %d cents): ledger %+v, want a grant and its taking back", no, o.amount, *g)
			}
		default:
			if g.rows != 0 {
				fail(true, false, "order %s (%s): ledger %+v, want nothing", no, o.status, *g)
			}
		}
	}

	// The broker: JetStream kept one message per event (a republished one
	// is a duplicate it drops), and nothing was dead-lettered.
	js, closeJS, err := jetStream(r.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer closeJS()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if s, err := js.Stream(sctx, streamOf(r.events)); err != nil {
		t.Errorf("stream %s: %v", streamOf(r.events), err)
	} else {
		e.streamMsgs = int(s.CachedInfo().State.Msgs)
	}
	if s, err := js.Stream(sctx, deadStreamOf(r.events)); err == nil {
		e.deadLetters = int(s.CachedInfo().State.Msgs)
	}
	if e.deadLetters > 0 {
		fail(false, true, "%d messages dead-lettered", e.deadLetters)
	}
	if e.streamMsgs != e.events {
		t.Logf("stream %s holds %d messages for %d events", streamOf(r.events), e.streamMsgs, e.events)
	}

	for _, c := range led.contradictions {
		fail(false, false, "contradicting answers: %s", c)
	}
	if errs > 40 {
		t.Errorf("… and %d more", errs-40)
	}
	return e
}
