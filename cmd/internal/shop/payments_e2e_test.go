package shop_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// TestShopdTwoProcessesOnePayment: a provider's callback, repeated thirty
// times at once across two shopd processes on one database, pays the
// order once: one payment row, one transition, every answer 200 SUCCESS.
func TestShopdTwoProcessesOnePayment(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db, dbArg := b.fresh(t)
			args := []string{"-db", dbArg, "-pay-secret", testPaySecret}
			procs := []*shopd{spawnShopd(t, args...), spawnShopd(t, args...)}
			for _, p := range procs {
				p.ready()
			}
			r := do(t, "POST", procs[0].base+"/orders", "11", "pay-two-procs", `{"sku":"SKU-1","quantity":2}`)
			if r.status != http.StatusCreated {
				t.Fatalf("create order: %d %s (%v)", r.status, r.body, r.err)
			}
			var o shop.Order
			if err := json.Unmarshal(r.body, &o); err != nil {
				t.Fatal(err)
			}
			body := []byte(callbackBody(o.OrderNo, "T-two-procs", o.AmountCents, "SUCCESS"))
			sig := shop.SignPayment(testPaySecret, time.Now(), body)
			const n = 30
			answers := make([]string, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					req, _ := http.NewRequest("POST", procs[i%2].base+"/payments/callback", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set(shop.PaySignatureHeader, sig)
					resp, err := client.Do(req)
					if err != nil {
						answers[i] = err.Error()
						return
					}
					defer resp.Body.Close()
					got, _ := io.ReadAll(resp.Body)
					answers[i] = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(got)))
				})
			}
			close(start)
			wg.Wait()
			for i, a := range answers {
				if a != `200 {"result":"SUCCESS"}` {
					t.Errorf("callback %d: %s", i, a)
				}
			}
			if c := payCount(t, db, b, `SELECT COUNT(*) FROM shop_payments WHERE order_no = ?`, o.OrderNo); c != 1 {
				t.Errorf("%d payment rows, want 1", c)
			}
			if got := readOrder(t, db, b, o.OrderNo); got.status != shop.StatusPaid || got.version != o.Version+1 {
				t.Errorf("order %+v, want PAID at version %d", got, o.Version+1)
			}
			for _, p := range procs {
				p.stop()
			}
		})
	}
}
