package shop_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// Two shopd processes over one database, each sent one submit token
// eight times at once with distinct idempotency keys (a client retrying
// through a load balancer with a fresh key each time): one order in the
// table, one 201 and DUPLICATE_SUBMISSION naming that order for every
// other, the stock reserved once and the token's row spent with the order.
func TestShopdOneTokenAcrossProcesses(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		db, dbArg := b.fresh(t)
		shopOn(t, db, b.dialect, shop.DefaultCatalog())
		procs := []*shopd{spawnShopd(t, "-db", dbArg), spawnShopd(t, "-db", dbArg)}
		for _, p := range procs {
			p.ready()
		}
		issued := post(t, procs[0].base+"/tokens", map[string]string{"X-User-ID": "21"}, "")
		var tok struct{ Token string }
		if issued.status != http.StatusCreated || json.Unmarshal(issued.body, &tok) != nil {
			t.Fatalf("POST /tokens: %d %s", issued.status, issued.body)
		}
		const perProc = 8
		replies := make([]reply, 2*perProc)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range replies {
			wg.Go(func() {
				<-start
				replies[i] = post(t, procs[i%2].base+"/orders", map[string]string{
					"X-User-ID": "21", "Idempotency-Key": fmt.Sprintf("k-%d", i), "Submit-Token": tok.Token,
				}, `{"sku":"SKU-1","quantity":1}`)
			})
		}
		close(start)
		wg.Wait()
		orderNo := ""
		for _, r := range replies {
			if r.status == http.StatusCreated {
				if orderNo != "" {
					t.Fatalf("two 201s: %s and %s", orderNo, r.body)
				}
				orderNo = r.json(t)["order_no"].(string)
			}
		}
		if orderNo == "" {
			t.Fatalf("no submission created the order: %+v", replies)
		}
		for i, r := range replies {
			if r.status == http.StatusCreated {
				continue
			}
			m := r.json(t)
			if r.status != http.StatusConflict || m["code"] != "DUPLICATE_SUBMISSION" || m["order_no"] != orderNo {
				t.Errorf("submission %d: %d %s, want 409 DUPLICATE_SUBMISSION naming %s", i, r.status, r.body, orderNo)
			}
		}
		for _, p := range procs {
			p.stop()
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != 1 {
			t.Errorf("%d orders, want 1", n)
		}
		if n := count(t, db, "SELECT COUNT(*) FROM shop_orders WHERE order_no = '"+orderNo+"' AND user_id = 21"); n != 1 {
			t.Errorf("the order %s is not in the table", orderNo)
		}
		if n := stock(t, db, "SKU-1"); n != 99 {
			t.Errorf("stock %d, want 99", n)
		}
		if got, want := tokenRows(t, db), []tokenRow{{true, orderNo}}; !slices.Equal(got, want) {
			t.Errorf("token rows %+v, want %+v", got, want)
		}
	})
}

// post sends a POST with header to url and reads the reply (a transport
// error fails the test).
func post(t *testing.T, url string, header map[string]string, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return reply{err: err}
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("POST %s: read body: %v", url, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}
