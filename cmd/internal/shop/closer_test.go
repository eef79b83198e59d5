package shop_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/sqlstore"
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

// jobRow reads the close job's fence row: the last fence its close
// transactions presented and how many of them committed.
func jobRow(t *testing.T, db *sql.DB) (lastFence, writes int64) {
	t.Helper()
	if err := db.QueryRow(`SELECT last_fence, fenced_writes FROM shop_jobs WHERE name = 'shop.close-unpaid'`).Scan(&lastFence, &writes); err != nil {
		t.Fatal(err)
	}
	return lastFence, writes
}

// lockRow reads the close job's lock in idem_locks: its owner ("" when
// free) and the last fence it handed out.
func lockRow(t *testing.T, db *sql.DB) (owner string, fence int64) {
	t.Helper()
	if err := db.QueryRow(`SELECT owner, fence FROM idem_locks WHERE name = 'shop.close-unpaid'`).Scan(&owner, &fence); err != nil {
		t.Fatal(err)
	}
	return owner, fence
}

// assertFenced checks the lock's and the fence row's traces of passes
// that closed orders: the lock is free, the row holds a fence the lock
// handed out, and at least closes transactions presented it.
func assertFenced(t *testing.T, db *sql.DB, closes int) {
	t.Helper()
	owner, fence := lockRow(t, db)
	last, writes := jobRow(t, db)
	if owner != "" || last < 1 || last > fence || writes < int64(closes) {
		t.Errorf("lock owner %q fence %d; job row last_fence %d, %d fenced writes; want a free lock, 1 <= last_fence <= %d, >= %d writes",
			owner, fence, last, writes, fence, closes)
	}
}

// Two jobs over one database, three passes each at once, close each
// expired order once: 10 closes in all, stock and claims given back once;
// an order within its pay time stays. Passes that find the lock held
// close nothing; no pass is ever fenced out (the lock lets one pass run
// at a time).
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
		expired := `SELECT COUNT(*) FROM shop_orders WHERE status = 'WAIT_PAY' AND created_ms = 1`
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
						if n == 0 && countRows(t, db, expired) == 0 {
							return
						}
					}
				})
			}
		}
		wg.Wait()
		for _, job := range jobs {
			job.Close()
		}
		assertFenced(t, db, len(orders))
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
		assertFenced(t, db, len(orders))
	})
}

// unawareLock hands out leases whose Context does not end with the
// lease: a holder that does not notice it lost the lock, as a process
// paused (GC, a suspended VM) between its check and its write.
type unawareLock struct{ lock.Acquirer }

func (u unawareLock) TryAcquire(ctx context.Context, name string) (lock.Lease, error) {
	l, err := u.Acquirer.TryAcquire(ctx, name)
	if err != nil {
		return nil, err
	}
	return unawareLease{l}, nil
}

type unawareLease struct{ lock.Lease }

func (unawareLease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithCancel(parent)
}

// A pass of job A, under a lease that runs out after a second (its
// maximum hold, long enough for A to reach its first close before it on
// a loaded machine), is paused before its first close until job B has
// taken the lock (a higher fence) and closed one order. Resumed, A closes nothing: if A
// watches its lease (its Context), it stops because the lease ended; if
// it does not notice (paused between its check and its write), its close
// transaction presents the old fence, which shop_jobs refuses
// (ErrFenced). Either way the two orders B left stay WAIT_PAY, holding
// their stock and claims.
func TestCloseJobPausedHolderIsFenced(t *testing.T) {
	for _, aware := range []bool{false, true} {
		name := "unaware"
		if aware {
			name = "aware"
		}
		t.Run(name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				s, db := newShop(t, b)
				orders := expiredOrders(t, s, db, 3)
				backendA, err := sqlstore.NewLockBackend(db, &sqlstore.Config{Dialect: b.dialect})
				if err != nil {
					t.Fatal(err)
				}
				defer backendA.Close()
				lockerA, err := lock.New(backendA, &lock.Config{TTL: time.Second, MaxHold: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				var lockA lock.Acquirer = lockerA
				if !aware {
					lockA = unawareLock{lockA}
				}
				jobA, err := s.NewCloser(&shop.CloserConfig{PayTimeout: time.Hour, Lock: lockA})
				if err != nil {
					t.Fatal(err)
				}
				paused, resume := make(chan string, 1), make(chan struct{})
				shop.SetBeforeClose(jobA, func(orderNo string) {
					select {
					case paused <- orderNo:
						<-resume
					default:
					}
				})
				type result struct {
					n   int
					err error
				}
				doneA := make(chan result, 1)
				go func() {
					n, err := jobA.RunOnce(context.Background())
					doneA <- result{n, err}
				}()
				var first string
				select {
				case first = <-paused:
				case r := <-doneA:
					t.Fatalf("job A ended before its first close: %d, %v", r.n, r.err)
				}

				jobB, err := s.NewCloser(&shop.CloserConfig{PayTimeout: time.Hour, Batch: 1, Budget: time.Nanosecond}) // one order a pass
				if err != nil {
					t.Fatal(err)
				}
				defer jobB.Close()
				deadline := time.Now().Add(20 * time.Second)
				for {
					n, err := jobB.RunOnce(context.Background())
					if err != nil {
						t.Fatalf("job B: %v", err)
					}
					if n == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("job B did not get the lock within 20 s of A's lease running out")
					}
					time.Sleep(20 * time.Millisecond)
				}
				_, fenceB := lockRow(t, db)
				if last, writes := jobRow(t, db); last != fenceB || writes != 1 {
					t.Fatalf("after B's pass the job row has last_fence %d and %d writes, want %d and 1", last, writes, fenceB)
				}

				close(resume)
				r := <-doneA
				switch {
				case r.n != 0:
					t.Errorf("job A closed %d orders after losing its lease", r.n)
				case aware && !errors.Is(r.err, lock.ErrMaxHold):
					t.Errorf("job A (watching its lease): %v, want the lease's end (lock.ErrMaxHold)", r.err)
				case !aware && !errors.Is(r.err, shop.ErrFenced):
					t.Errorf("job A (not noticing): %v, want shop.ErrFenced", r.err)
				}
				if last, writes := jobRow(t, db); last != fenceB || writes != 1 {
					t.Errorf("after A resumed the job row has last_fence %d and %d writes, want %d and 1 (B's)", last, writes, fenceB)
				}
				if c := statusCounts(t, db); c["CLOSED"] != 1 || c["WAIT_PAY"] != 2 {
					t.Errorf("statuses %v, want 1 CLOSED (by B) and 2 WAIT_PAY", c)
				}
				if r := readOrderRow(t, db, b.dialect, first, orders[0].UserID); first != orders[0].OrderNo || r.Status != "CLOSED" || r.Version != 2 {
					t.Errorf("A paused before %s, B closed %+v; want the oldest order %s closed once", first, r, orders[0].OrderNo)
				}
				if got := stock(t, db, "SKU-1"); got != 100-2 {
					t.Errorf("stock %d, want %d (one order's item given back, once)", got, 100-2)
				}
				if n := countRows(t, db, `SELECT COUNT(*) FROM shop_coupon_claims WHERE status = 'USED'`); n != 2 {
					t.Errorf("%d claims USED, want 2", n)
				}
			})
		})
	}
}

func TestCloserRefusesBadConfig(t *testing.T) {
	t.Parallel()
	s, _ := newShop(t, sqliteBackend)
	for _, cfg := range []shop.CloserConfig{
		{PayTimeout: -time.Second},
		{PayTimeout: shop.MaxPayTimeout + 1},
		{Interval: -1},
		{Batch: -1},
		{Budget: -1},
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

// A pass of the close job sweeps expired submit tokens, used or not, and
// keeps live ones.
func TestCloseJobSweepsExpiredTokens(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		issue := func() string {
			rec := serve(s, "POST", "/tokens", map[string]string{"X-User-ID": "5"}, "")
			if rec.Code != 201 {
				t.Fatalf("POST /tokens: %d %s", rec.Code, rec.Body)
			}
			return rec.Body.String()
		}
		issue()
		issue()
		mustExec(t, db, `UPDATE idem_tokens SET expires_at = 1`)
		issue()
		runPass(t, newCloser(t, s, nil))
		if n := countRows(t, db, `SELECT COUNT(*) FROM idem_tokens`); n != 1 {
			t.Errorf("%d tokens left, want the live one", n)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM idem_tokens WHERE expires_at = 1`); n != 0 {
			t.Errorf("%d expired tokens left", n)
		}
	})
}

// The pay timeout is counted on the database's clock, never a shopd
// process's: an order's created_ms is the database's time, and the close
// job's cutoff the database's time less the timeout. Before, both came
// from the process that ran the statement, so an instance whose clock ran
// an hour fast closed every order other instances had placed in the last
// half hour (their payments then refused as ORDER_NOT_PAYABLE), and one
// whose clock was slow kept orders past their time. MariaDB lets a session
// set its clock (SET timestamp), so a second pool over the same database
// is the database two hours later: there the order placed now has waited
// two hours, and the order placed "two hours later" is fresh when seen now.
func TestCloseJobCountsOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	db, dsn := testdb.MySQL(t)
	now := shopOn(t, db, sqlstore.MySQL, shop.DefaultCatalog())
	sep := "?"
	if strings.Contains(dsn[strings.LastIndexByte(dsn, ')')+1:], "?") {
		sep = "&"
	}
	later := testdb.Open(t, "mysql", fmt.Sprintf("%s%stimestamp=%d", dsn, sep, time.Now().Add(2*time.Hour).Unix()), testenv.MySQL)
	store, err := sqlstore.New(later, &sqlstore.Config{Dialect: sqlstore.MySQL})
	if err != nil {
		t.Fatal(err)
	}
	inTwoHours, err := shop.New(shop.Config{DB: later, Dialect: sqlstore.MySQL, Store: store, Provider: testProvider(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, placedNow, code := postOrder(t, now, 1, "placed-now", `{"sku":"SKU-1","quantity":1}`)
	if code != "" {
		t.Fatal(code)
	}
	_, placedLater, code := postOrder(t, inTwoHours, 2, "placed-later", `{"sku":"SKU-1","quantity":1}`)
	if code != "" {
		t.Fatal(code)
	}
	run := func(s *shop.Shop) int {
		c, err := s.NewCloser(&shop.CloserConfig{PayTimeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		n, err := c.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Now, on the database's clock: the order placed "two hours later"
	// has not waited at all, the other a moment.
	if n := run(now); n != 0 {
		t.Fatalf("the job closed %d orders that waited less than the pay timeout on the database's clock", n)
	}
	// Two hours later on the database's clock: the order placed now has
	// waited two hours, the other a moment.
	if n := run(inTwoHours); n != 1 {
		t.Fatalf("two hours later on the database's clock the job closed %d orders, want 1 (the one placed two hours before)", n)
	}
	for _, o := range []struct {
		no, want string
	}{{placedNow.OrderNo, shop.StatusClosed}, {placedLater.OrderNo, shop.StatusWaitPay}} {
		var st string
		if err := db.QueryRow(`SELECT status FROM shop_orders WHERE order_no = ?`, o.no).Scan(&st); err != nil || st != o.want {
			t.Errorf("order %s is %s (%v), want %s", o.no, st, err, o.want)
		}
	}
}
