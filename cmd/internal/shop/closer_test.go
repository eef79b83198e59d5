package shop_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// expiredOrders places n orders of one SKU-1 each, users 1..n, each with a
// claim of coupon 1, and backdates them past any pay timeout.
func expiredOrders(t *testing.T, s *shop.Shop, db *sql.DB, n int) []shop.Order {
	t.Helper()
	orders := make([]shop.Order, n)
	for i := range n {
		user := int64(i + 1)
		if status, _, code := claimCoupon(t, s, user, "1"); status != 201 {
			t.Fatalf("claim: %d %s", status, code)
		}
		status, o, code := postOrder(t, s, user, "expired", `{"sku":"SKU-1","quantity":1,"coupon_id":1}`)
		if status != 201 {
			t.Fatalf("order: %d %s", status, code)
		}
		orders[i] = o
	}
	mustExec(t, db, `UPDATE shop_orders SET created_ms = 1`)
	return orders
}

// statusCounts counts orders by status.
func statusCounts(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT status, COUNT(*) FROM shop_orders GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		m[s] = n
	}
	return m
}

// assertGivenBackOnce checks the effect of closes and cancels: every order
// not paid holds nothing (stock back, claim UNUSED), every paid one still
// holds its item and its claim, and every order moved once (version 2).
func assertGivenBackOnce(t *testing.T, db *sql.DB, orders []shop.Order, stock int64) {
	t.Helper()
	paid := 0
	for _, o := range orders {
		var status, claim string
		var version int64
		if err := db.QueryRow(`SELECT o.status, o.version, c.status FROM shop_orders o JOIN shop_coupon_claims c ON c.user_id = o.user_id AND c.coupon_id = 1 WHERE o.order_no = '`+o.OrderNo+`'`).Scan(&status, &version, &claim); err != nil {
			t.Fatal(err)
		}
		want := "UNUSED"
		if status == "PAID" {
			paid++
			want = "USED"
		}
		if version != 2 || claim != want || status == "WAIT_PAY" {
			t.Errorf("order %s: %s at version %d, claim %s; want one transition and the claim %s", o.OrderNo, status, version, claim, want)
		}
	}
	var got int64
	if err := db.QueryRow(`SELECT stock FROM shop_products WHERE sku = 'SKU-1'`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := stock - int64(paid); got != want {
		t.Errorf("stock %d, want %d (%d paid of %d orders): given back other than once", got, want, paid, len(orders))
	}
	if n := countRows(t, db, `SELECT claimed FROM shop_coupons WHERE id = 1`); n != len(orders) {
		t.Errorf("coupon 1 claimed %d, want %d (a give-back returns the claim, not the coupon's quantity)", n, len(orders))
	}
}

// Two jobs over one database, three passes each at once, close each
// expired order once: 10 closes in all, stock and claims given back once;
// an order within its pay time stays.
func TestCloseJobClosesExpiredOnce(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		orders := expiredOrders(t, s, db, 10)
		_, fresh, _ := postOrder(t, s, 99, "fresh", `{"sku":"SKU-1","quantity":5}`)
		jobs := make([]*shop.Closer, 2)
		for i := range jobs {
			c, err := s.NewCloser(&shop.CloserConfig{PayTimeout: time.Hour, Batch: 4})
			if err != nil {
				t.Fatal(err)
			}
			jobs[i] = c
		}
		var mu sync.Mutex
		closed := 0
		var wg sync.WaitGroup
		for _, job := range jobs {
			for range 3 {
				wg.Go(func() {
					for {
						n, err := job.RunOnce(context.Background())
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						closed += n
						mu.Unlock()
						if n == 0 {
							return
						}
					}
				})
			}
		}
		wg.Wait()
		if closed != len(orders) {
			t.Errorf("the jobs closed %d orders, want %d", closed, len(orders))
		}
		if c := statusCounts(t, db); c["CLOSED"] != len(orders) || c["WAIT_PAY"] != 1 {
			t.Errorf("statuses %v, want %d CLOSED and the fresh order WAIT_PAY", c, len(orders))
		}
		assertGivenBackOnce(t, db, orders, 100-5)
		if r := readOrderRow(t, db, b.dialect, fresh.OrderNo, 99); r.Status != "WAIT_PAY" || r.Version != 1 {
			t.Errorf("the fresh order: %+v", r)
		}
	})
}

// The job races the owners' cancels (even orders) and late payments (odd
// orders, the payment's conditional update): every order moves once,
// nothing is given back twice, and no paid order is closed.
func TestCloseJobRacesCancelAndPayment(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		orders := expiredOrders(t, s, db, 24)
		pay := `UPDATE shop_orders SET status = 'PAID', version = version + 1 WHERE order_no = ? AND status = 'WAIT_PAY' AND version = 1`
		if b.name == "postgres" {
			pay = `UPDATE shop_orders SET status = 'PAID', version = version + 1 WHERE order_no = $1 AND status = 'WAIT_PAY' AND version = 1`
		}
		job, err := s.NewCloser(&shop.CloserConfig{PayTimeout: time.Minute, Batch: 3})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 2 {
			wg.Go(func() {
				<-start
				for {
					n, err := job.RunOnce(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					if n == 0 && countRows(t, db, `SELECT COUNT(*) FROM shop_orders WHERE status = 'WAIT_PAY'`) == 0 {
						return
					}
				}
			})
		}
		for i, o := range orders {
			wg.Go(func() {
				<-start
				if i%2 == 0 {
					if status, got, code := cancel(t, s, o.UserID, o.OrderNo); status != 200 && !(status == 409 && code == "ORDER_NOT_CANCELLABLE") || status == 200 && got.Status != "CANCELLED" {
						t.Errorf("cancel %s: %d %s %+v", o.OrderNo, status, code, got)
					}
					return
				}
				if _, err := db.Exec(pay, o.OrderNo); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		c := statusCounts(t, db)
		if c["WAIT_PAY"] != 0 || c["CLOSED"]+c["CANCELLED"]+c["PAID"] != len(orders) {
			t.Errorf("statuses %v", c)
		}
		for i, o := range orders {
			r := readOrderRow(t, db, b.dialect, o.OrderNo, o.UserID)
			if i%2 == 0 && r.Status == "PAID" || i%2 == 1 && r.Status == "CANCELLED" {
				t.Errorf("order %d: %s", i, r.Status)
			}
		}
		t.Logf("statuses %v", c)
		assertGivenBackOnce(t, db, orders, 100)
	})
}

// Several shopd processes with a short -pay-timeout over one database
// holding expired orders: their jobs close each order once, and the stock
// and claims come back once.
func TestShopdCloseJobAcrossProcesses(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		db, dbArg := b.fresh(t)
		s := shopOn(t, db, b.dialect, shop.DefaultCatalog())
		orders := expiredOrders(t, s, db, 30)
		procs := []*shopd{
			spawnShopd(t, "-db", dbArg, "-pay-timeout", "1s"),
			spawnShopd(t, "-db", dbArg, "-pay-timeout", "1s"),
			spawnShopd(t, "-db", dbArg, "-pay-timeout", "1s"),
		}
		for _, p := range procs {
			p.ready()
		}
		deadline := time.Now().Add(30 * time.Second)
		for countRows(t, db, `SELECT COUNT(*) FROM shop_orders WHERE status = 'WAIT_PAY'`) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("orders still waiting after 30 s: %v", statusCounts(t, db))
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, p := range procs {
			p.stop()
		}
		if c := statusCounts(t, db); c["CLOSED"] != len(orders) {
			t.Errorf("statuses %v, want %d CLOSED", c, len(orders))
		}
		assertGivenBackOnce(t, db, orders, 100)
	})
}

func TestCloserRefusesBadConfig(t *testing.T) {
	t.Parallel()
	s, _ := newShop(t, sqliteBackend)
	for _, cfg := range []shop.CloserConfig{
		{PayTimeout: -time.Second},
		{PayTimeout: shop.MaxPayTimeout + 1},
		{Interval: -1},
		{Batch: -1},
	} {
		if _, err := s.NewCloser(&cfg); err == nil {
			t.Errorf("NewCloser(%+v) accepted", cfg)
		}
	}
	c, err := s.NewCloser(nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Start()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
