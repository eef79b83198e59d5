package killsoak_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// TestNewKeyAfterLostAnswerOrdersTwice shows where shopd's guarantee
// stops: an order's answer lost after shopd created it (as the soak's
// lost HTTP replies do), a client that sends the order again under a new
// Idempotency-Key gets a second order. The key is the client's promise
// that two requests are one; only a retry with the first key is answered
// with the first order.
func TestNewKeyAfterLostAnswerOrdersTwice(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1, true)
	var lost atomic.Bool
	r.front[0].DropResponsesIf(func(req []byte) bool {
		rq, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(req)))
		return err == nil && rq.URL.Path == "/orders" && lost.CompareAndSwap(false, true)
	})
	c := &lb{bases: r.bases(), http: &http.Client{}, fig: &figures{}}
	user := newTraffic(nil, nil).users
	order := func(key string) answer {
		a, retry := c.attempt(r.bases()[0], call{path: "/orders", user: user, key: key, body: []byte(`{"sku":"PLENTY","quantity":1}`)})
		if retry && a.status != 0 {
			t.Fatalf("order %s: %d %s", key, a.status, a.body)
		}
		return a
	}
	if a := order("first"); a.status != 0 {
		t.Fatalf("the first answer was not lost: %d %s", a.status, a.body)
	}
	second := order("second") // a client that made a new key
	again := order("first")   // a client that kept its key
	var o2, o1 shop.Order
	json.Unmarshal(second.body, &o2)
	json.Unmarshal(again.body, &o1)
	if second.status != http.StatusCreated || again.status != http.StatusCreated || !again.replayed || o1.OrderNo == o2.OrderNo {
		t.Fatalf("new key: %d %s; first key again: %d (replayed %v) %s", second.status, second.body, again.status, again.replayed, again.body)
	}
	var n int
	if err := r.db.QueryRow(fmt.Sprintf(`SELECT COUNT(*) FROM shop_orders WHERE user_id = %d`, user)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d orders, want 2: the lost one and the new key's", n)
	}
}
