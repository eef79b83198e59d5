package shop_test

import (
	"bufio"
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/sqlstore"
)

// TestShopdRetryingClientsLostResponses puts shopd behind a proxy that
// loses the first response to every order request, after shopd has
// handled it (created the order, reserved the stock, stored the answer).
// 50 clients post an order each at once through idemclient.Transport,
// which retries with the key it gave the request: every client gets its
// 201, shopd has exactly one order per client, and the stock went down by
// exactly the quantities ordered. On SQLite, PostgreSQL and MySQL.
func TestShopdRetryingClientsLostResponses(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db, dbArg := b.fresh(t)
			s := spawnShopd(t, "-db", dbArg)
			s.ready()
			proxy, err := netfault.New(strings.TrimPrefix(s.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()

			// Lose the answer to the first request with each key.
			var mu sync.Mutex
			lost := map[string]bool{}
			proxy.DropResponsesIf(func(request []byte) bool {
				req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(request)))
				if err != nil || req.Method != http.MethodPost || req.URL.Path != "/orders" {
					return false
				}
				key := req.Header.Get("Idempotency-Key")
				mu.Lock()
				defer mu.Unlock()
				if key == "" || lost[key] {
					return false
				}
				lost[key] = true
				return true
			})

			var stockBefore int64
			if err := db.QueryRowContext(t.Context(), "SELECT stock FROM shop_products WHERE sku = 'BOOK-1'").Scan(&stockBefore); err != nil {
				t.Fatal(err)
			}

			const clients, quantity = 50, 2
			firstUser := rand.Int64N(1<<40) + 1 // users of the test's own
			type result struct {
				status  int
				orderNo string
				key     string
				retries int
				err     error
			}
			results := make([]result, clients)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range clients {
				wg.Go(func() {
					var retries int
					transport := &idemclient.Transport{
						Base:        &http.Transport{},
						MaxAttempts: 10,
						BaseDelay:   10 * time.Millisecond,
						MaxDelay:    500 * time.Millisecond,
						OnRetry:     func(idemclient.Retry) { retries++ },
					}
					defer transport.CloseIdleConnections()
					client := &http.Client{Transport: transport, Timeout: time.Minute}
					req, err := http.NewRequest(http.MethodPost, "http://"+proxy.Addr()+"/orders",
						strings.NewReader(fmt.Sprintf(`{"sku":"BOOK-1","quantity":%d}`, quantity)))
					if err != nil {
						results[i].err = err
						return
					}
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-User-ID", fmt.Sprint(firstUser+int64(i)))
					<-start
					resp, err := client.Do(req)
					if err != nil {
						results[i] = result{err: err, retries: retries}
						return
					}
					defer resp.Body.Close()
					var order struct {
						OrderNo string `json:"order_no"`
					}
					body, _ := io.ReadAll(resp.Body)
					json.Unmarshal(body, &order)
					results[i] = result{resp.StatusCode, order.OrderNo, resp.Request.Header.Get("Idempotency-Key"), retries, nil}
				})
			}
			close(start)
			wg.Wait()

			retried := 0
			for i, r := range results {
				if r.err != nil || r.status != http.StatusCreated || r.orderNo == "" {
					t.Errorf("client %d: %d order %q after %d retries (%v), want 201 and its order", i, r.status, r.orderNo, r.retries, r.err)
					continue
				}
				if r.retries > 0 {
					retried++
				}
				mu.Lock()
				wasLost := lost[r.key]
				mu.Unlock()
				if !wasLost {
					t.Errorf("client %d (key %q): its first answer was not lost", i, r.key)
				}
			}
			if retried != clients {
				t.Errorf("%d of %d clients retried, want all (each lost an answer)", retried, clients)
			}

			// The effect: one order per client, the one it was told about.
			orders := ordersOf(t, db, b, firstUser, firstUser+clients, quantity)
			if len(orders) != clients {
				t.Errorf("%d clients have orders, want %d", len(orders), clients)
			}
			for i, r := range results {
				got := orders[firstUser+int64(i)]
				if len(got) != 1 || got[0] != r.orderNo {
					t.Errorf("client %d: orders %q, was answered %q; want exactly that one", i, got, r.orderNo)
				}
			}
			var stockAfter int64
			if err := db.QueryRowContext(t.Context(), "SELECT stock FROM shop_products WHERE sku = 'BOOK-1'").Scan(&stockAfter); err != nil {
				t.Fatal(err)
			}
			if want := stockBefore - clients*quantity; stockAfter != want {
				t.Errorf("stock %d after %d orders of %d from %d, want %d", stockAfter, clients, quantity, stockBefore, want)
			}
			mu.Lock()
			t.Logf("%d answers lost, every client got its order; stock %d → %d", len(lost), stockBefore, stockAfter)
			mu.Unlock()
			proxy.DropResponsesIf(nil)
			s.stop()
		})
	}
}

// ordersOf returns the order numbers of the users from first to end
// (excluded), by user, and fails the test for an order whose quantity is
// not quantity.
func ordersOf(t *testing.T, db *sql.DB, b backend, first, end int64, quantity int) map[int64][]string {
	t.Helper()
	query := "SELECT user_id, order_no, quantity FROM shop_orders WHERE user_id >= ? AND user_id < ?"
	if b.dialect == sqlstore.PostgreSQL {
		query = "SELECT user_id, order_no, quantity FROM shop_orders WHERE user_id >= $1 AND user_id < $2"
	}
	rows, err := db.QueryContext(t.Context(), query, first, end)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	orders := map[int64][]string{}
	for rows.Next() {
		var user, qty int64
		var no string
		if err := rows.Scan(&user, &no, &qty); err != nil {
			t.Fatal(err)
		}
		if qty != int64(quantity) {
			t.Errorf("order %s has quantity %d, want %d", no, qty, quantity)
		}
		orders[user] = append(orders[user], no)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return orders
}
