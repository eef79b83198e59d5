package shop_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// expiredTokens writes n submit tokens of user 5 that expired long ago
// straight into idem_tokens, a few hundred rows a statement.
func expiredTokens(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	const chunk = 500
	for start := 0; start < n; start += chunk {
		var values []string
		for i := start; i < min(start+chunk, n); i++ {
			values = append(values, fmt.Sprintf("('%064x', 'user:5', 1, 2)", i))
		}
		mustExec(t, db, `INSERT INTO idem_tokens (digest, scope, created_at, expires_at) VALUES `+strings.Join(values, ","))
	}
}

// burstOrders places n orders of one BOOK-1 each, users 1..n, and
// backdates them past any pay timeout.
func burstOrders(t *testing.T, s *shop.Shop, db *sql.DB, n int) {
	t.Helper()
	for i := range n {
		user := int64(i + 1)
		if status, _, code := postOrder(t, s, user, "burst-"+strconv.Itoa(i), `{"sku":"BOOK-1","quantity":1}`); status != 201 {
			t.Fatalf("order %d: %d %s", i, status, code)
		}
	}
	mustExec(t, db, `UPDATE shop_orders SET created_ms = 1`)
}

// bookStock reads BOOK-1's stock.
func bookStock(t *testing.T, db *sql.DB) int {
	t.Helper()
	return countRows(t, db, `SELECT stock FROM shop_products WHERE sku = 'BOOK-1'`)
}

// newCloser returns s's close job configured by cfg, closed at the end of
// the test.
func newCloser(t *testing.T, s *shop.Shop, cfg *shop.CloserConfig) *shop.Closer {
	t.Helper()
	job, err := s.NewCloser(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { job.Close() })
	return job
}

// runPass runs one pass of job and returns how many orders it closed.
func runPass(t *testing.T, job *shop.Closer) int {
	t.Helper()
	closed, err := job.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return closed
}

// One pass of the close job sweeps a pile of expired submit tokens much
// larger than one sweep statement deletes (3,000, three statements'
// worth): it loops until none is left.
func TestCloseJobSweepsAllExpiredTokensInOnePass(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		expiredTokens(t, db, 3000)
		if rec := serve(s, "POST", "/tokens", map[string]string{"X-User-ID": "5"}, ""); rec.Code != 201 {
			t.Fatalf("POST /tokens: %d %s", rec.Code, rec.Body)
		}
		runPass(t, newCloser(t, s, nil))
		if n := countRows(t, db, `SELECT COUNT(*) FROM idem_tokens`); n != 1 {
			t.Errorf("%d tokens left after one pass, want the live one (3,000 expired swept)", n)
		}
	})
}

// One pass of the close job closes a burst of expired orders much larger
// than its batch (500, five batches of the default 100), and gives back
// the stock of each.
func TestCloseJobClosesAllExpiredOrdersInOnePass(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		before := bookStock(t, db)
		burstOrders(t, s, db, 500)
		if got := bookStock(t, db); got != before-500 {
			t.Fatalf("stock %d after 500 orders, want %d", got, before-500)
		}
		if closed := runPass(t, newCloser(t, s, &shop.CloserConfig{PayTimeout: time.Hour})); closed != 500 {
			t.Errorf("one pass closed %d orders, want 500", closed)
		}
		if got := statusCounts(t, db); got["CLOSED"] != 500 || got["WAIT_PAY"] != 0 {
			t.Errorf("orders by status %v after one pass, want 500 CLOSED", got)
		}
		if got := bookStock(t, db); got != before {
			t.Errorf("stock %d after the pass, want %d (all given back)", got, before)
		}
	})
}

// A pass starts no new batch once its budget is spent, and the next pass
// goes on where it stopped. A budget of a nanosecond is spent by the
// first batch of each part: every pass closes one batch of orders and
// sweeps one statement's worth of tokens, however many are left.
func TestCloseJobPassStopsAtItsBudget(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		before := bookStock(t, db)
		burstOrders(t, s, db, 5)
		expiredTokens(t, db, 2500)
		job := newCloser(t, s, &shop.CloserConfig{PayTimeout: time.Hour, Batch: 2, Budget: time.Nanosecond})
		for i, want := range []struct{ closed, waiting, tokens int }{{2, 3, 1500}, {2, 1, 500}, {1, 0, 0}, {0, 0, 0}} {
			closed := runPass(t, job)
			waiting := statusCounts(t, db)["WAIT_PAY"]
			tokens := countRows(t, db, `SELECT COUNT(*) FROM idem_tokens`)
			if closed != want.closed || waiting != want.waiting || tokens != want.tokens {
				t.Errorf("pass %d: closed %d orders, %d waiting, %d tokens left; want %d, %d, %d",
					i+1, closed, waiting, tokens, want.closed, want.waiting, want.tokens)
			}
		}
		if got := bookStock(t, db); got != before {
			t.Errorf("stock %d after the passes, want %d", got, before)
		}
	})
}
