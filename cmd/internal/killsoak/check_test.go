package killsoak_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a testing.TB whose Errorf only records.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestCheckFindsBrokenInvariants: the checker of the kill loop and the
// soak is not vacuous. After a short run without faults the database
// passes it; each corruption below, made in the checker's transaction
// and rolled back, is reported.
func TestCheckFindsBrokenInvariants(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1, false)
	tr := newTraffic(r.bases(), &figures{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { tr.runWorkers(4, stop) })
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	r.settle(t)
	if r.check(t, tr.led); t.Failed() {
		t.Fatal("the run without faults does not pass")
	}
	var paid, key string
	if err := r.db.QueryRow(`SELECT order_no FROM shop_orders WHERE status = 'PAID' LIMIT 1`).Scan(&paid); err != nil {
		t.Fatalf("no paid order: %v", err)
	}
	if err := r.db.QueryRow(`SELECT idempotency_key FROM idem_records WHERE idempotency_key LIKE 'o-%' AND response_status = 201 LIMIT 1`).Scan(&key); err != nil {
		t.Fatalf("no order record: %v", err)
	}
	for _, c := range []struct{ name, stmt, want string }{
		{"a second payment", `INSERT INTO shop_payments (trade_no, order_no, amount_cents, created_ms)
			SELECT 'T-again', order_no, amount_cents, 0 FROM shop_orders WHERE order_no = '` + paid + `'`, "has 2 payments"},
		{"a paid order cancelled", `UPDATE shop_orders SET status = 'CANCELLED' WHERE order_no = '` + paid + `'`, "is CANCELLED with payments"},
		{"a unit of stock lost", `UPDATE shop_products SET stock = stock - 1 WHERE sku = 'PLENTY'`, "the catalogue had"},
		{"points granted twice", `UPDATE shop_points SET points = points * 2 WHERE order_no = '` + paid + `'`, "want one grant"},
		{"an event dead-lettered", `UPDATE idem_inbox SET status = 'dead' WHERE message_id = (SELECT msg_id FROM idem_outbox ORDER BY id LIMIT 1)`, "consume record dead"},
		{"an event never sent", `UPDATE idem_outbox SET sent_at = NULL WHERE id = (SELECT MIN(id) FROM idem_outbox)`, "was never sent"},
		{"an event never handled", `DELETE FROM idem_inbox WHERE message_id = (SELECT msg_id FROM idem_outbox ORDER BY id LIMIT 1)`, "was never handled"},
		{"a claim counted twice", `UPDATE shop_coupons SET claimed = claimed + 1`, "counted"},
		{"an order without its answer", `DELETE FROM idem_records WHERE idempotency_key = '` + key + `'`, "no idempotency record names it"},
		{"an answered order lost", `DELETE FROM shop_orders WHERE order_no = '` + paid + `'`, "which the database does not have"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := r.db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if res, err := tx.Exec(c.stmt); err != nil {
				t.Fatalf("%s: %v", c.stmt, err)
			} else if n, _ := res.RowsAffected(); n == 0 {
				t.Fatalf("%s changed nothing", c.stmt)
			}
			rec := &recorder{TB: t}
			r.checkIn(rec, tx, tr.led)
			found := false
			for _, e := range rec.errs {
				found = found || strings.Contains(e, c.want)
			}
			if !found {
				t.Errorf("no error says %q; errors: %q", c.want, rec.errs)
			}
		})
	}
}
