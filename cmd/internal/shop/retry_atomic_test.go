package shop_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/sqlstore"
)

// TestRetryEventFailsWhole: a retry of a dead loyalty event that cannot
// write the event again (here its order is gone) leaves the message dead,
// so that the operator can retry it once the cause is fixed; a retry that
// succeeds makes it failed, awaiting the event written again, and a
// second retry finds nothing dead.
func TestRetryEventFailsWhole(t *testing.T) {
	s, db := newShop(t, sqliteBackend)
	ctx := context.Background()
	in, err := sqlstore.NewInboxStore(db, sqlstore.SQLite)
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
		var row int64
		if err := db.QueryRowContext(ctx, `SELECT MAX(id) FROM idem_outbox WHERE msg_key = ?`, o.OrderNo).Scan(&row); err != nil {
			t.Fatal(err)
		}
		id = shop.DefaultEventIDPrefix + fmt.Sprint(row)
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
	if _, err := db.ExecContext(ctx, `UPDATE shop_orders SET order_no = 'gone-' || order_no WHERE order_no = ?`, orderNo); err != nil {
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
}
