package shop_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/sqlstore"
)

// TestRetryEventFailsWhole: a retry of a dead loyalty event that cannot
// write the event again (here its order was deleted) leaves the message dead,
// so that the operator can retry it once the cause is fixed; a retry that
// succeeds makes it failed, awaiting the event written again, and a
// second retry finds nothing dead; an event of an older shopd (its ID
// the prefix and the row's id) is retried too; of two concurrent
// retries, one is done.
func TestRetryEventFailsWhole(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) { testRetryEventFailsWhole(t, b) })
}

func testRetryEventFailsWhole(t *testing.T, b backend) {
	s, db := newShop(t, b)
	ctx := context.Background()
	q := func(query string) string {
		if b.dialect == sqlstore.PostgreSQL {
			return strings.ReplaceAll(query, "?", "$1")
		}
		return query
	}
	in, err := sqlstore.NewInboxStore(db, &sqlstore.Config{Dialect: b.dialect})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := in.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	dead := func(user string) (id, orderNo string) {
		t.Helper()
		rec := serve(s, "POST", "/orders", map[string]string{"X-User-ID": user, "Idempotency-Key": "retry-" + user, "Content-Type": "application/json"},
			`{"sku":"BOOK-1","quantity":1}`)
		if rec.Code != http.StatusCreated {
			t.Fatalf("order: %d %s", rec.Code, rec.Body)
		}
		var o shop.Order
		if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"order_no":%q,"trade_no":"T-%s","amount_cents":%d,"status":"SUCCESS"}`, o.OrderNo, o.OrderNo, o.AmountCents)
		pay := serve(s, "POST", "/payments/callback", map[string]string{shop.PaySignatureHeader: shop.SignPayment(shop.DevPaySecret, time.Now(), []byte(body))}, body)
		if pay.Code != http.StatusOK {
			t.Fatalf("callback: %d %s", pay.Code, pay.Body)
		}
		if err := db.QueryRowContext(ctx, q(`SELECT msg_id FROM idem_outbox WHERE id = (SELECT MAX(id) FROM idem_outbox WHERE msg_key = ?)`), o.OrderNo).Scan(&id); err != nil {
			t.Fatal(err)
		}
		c, err := in.Claim(ctx, shop.LoyaltyGroup, id, time.Minute, 1)
		if err != nil || !c.Claimed {
			t.Fatal(c, err)
		}
		if st, err := in.Fail(ctx, shop.LoyaltyGroup, id, c.Fence, 1, "points down"); err != nil || st != inbox.StatusDead {
			t.Fatal(st, err)
		}
		return id, o.OrderNo
	}
	status := func(id string) inbox.Status {
		t.Helper()
		r, err := in.Get(ctx, shop.LoyaltyGroup, id)
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}

	id, orderNo := dead("301")
	if _, err := db.ExecContext(ctx, q(`DELETE FROM shop_orders WHERE order_no = ?`), orderNo); err != nil {
		t.Fatal(err)
	}
	if err := s.RetryEvent(ctx, in, shop.LoyaltyGroup, id); err == nil {
		t.Fatal("RetryEvent of an event whose order is gone: no error")
	}
	if st := status(id); st != inbox.StatusDead {
		t.Fatalf("after a failed retry the message is %s, want still dead (retryable from the page)", st)
	}

	id2, _ := dead("302")
	if err := s.RetryEvent(ctx, in, shop.LoyaltyGroup, id2); err != nil {
		t.Fatalf("RetryEvent: %v", err)
	}
	if st := status(id2); st != inbox.StatusFailed {
		t.Fatalf("after a retry the message is %s, want failed", st)
	}
	if err := s.RetryEvent(ctx, in, shop.LoyaltyGroup, id2); err == nil {
		t.Fatal("a second RetryEvent of the same message: no error")
	}

	// An event an older shopd wrote (msg_id NULL) is found by its ID,
	// the prefix and the row's id.
	id4, _ := dead("304")
	var row int64
	if err := db.QueryRowContext(ctx, q(`SELECT id FROM idem_outbox WHERE msg_id = ?`), id4).Scan(&row); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, q(`UPDATE idem_outbox SET msg_id = NULL WHERE msg_id = ?`), id4); err != nil {
		t.Fatal(err)
	}
	legacy := shop.DefaultEventIDPrefix + fmt.Sprint(row)
	if c, err := in.Claim(ctx, shop.LoyaltyGroup, legacy, time.Minute, 1); err != nil || !c.Claimed {
		t.Fatal(c, err)
	} else if st, err := in.Fail(ctx, shop.LoyaltyGroup, legacy, c.Fence, 1, "points down"); err != nil || st != inbox.StatusDead {
		t.Fatal(st, err)
	}
	if err := s.RetryEvent(ctx, in, shop.LoyaltyGroup, legacy); err != nil {
		t.Fatalf("RetryEvent of an older shopd's event %s: %v", legacy, err)
	}
	if st := status(legacy); st != inbox.StatusFailed {
		t.Fatalf("after a retry the older shopd's message is %s, want failed", st)
	}

	// Two operators retry one dead message at once: one retry is done,
	// the event is written again once, not twice.
	id3, orderNo3 := dead("303")
	retries := func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, q(`SELECT COUNT(*) FROM idem_outbox WHERE msg_key = ?`), orderNo3).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := retries()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- s.RetryEvent(ctx, in, shop.LoyaltyGroup, id3) }()
	}
	ok := 0
	for range 2 {
		if err := <-errs; err == nil {
			ok++
		}
	}
	if ok != 1 || retries() != before+1 || status(id3) != inbox.StatusFailed {
		t.Fatalf("two concurrent retries: %d done, %d events written, message %s; want 1, 1, failed", ok, retries()-before, status(id3))
	}
}
