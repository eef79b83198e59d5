package killsoak_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// ledger is what the clients were told: every final 2xx answer, and the
// contradictions they saw between answers.
type ledger struct {
	mu sync.Mutex
	// orders: the key's 201, by key.
	orders map[string]sentOrder
	// refused: keys of orders finally refused (a status other than 201).
	refused map[string]int
	// paid: trade → order of callbacks answered 200; unpayable: answered
	// 409 (the order was cancelled or closed first).
	paid, unpayable map[string]string
	// refunds: order → refund number of refunds answered 2xx.
	refunds map[string]string
	// cancelled: orders whose cancel was answered 200.
	cancelled map[string]bool
	// claims: users whose coupon claim was answered 2xx.
	claims map[int64]bool
	// tokens: submit token → the order a 201 created with it.
	tokens map[string]string
	// ops counts each kind of operation that got a final answer.
	ops map[string]int
	// contradictions between answers (two orders for one key, say).
	contradictions []string
}

type sentOrder struct {
	orderNo  string
	user     int64
	sku      string
	quantity int
	coupon   bool
	token    string
}

func newLedger() *ledger {
	return &ledger{orders: map[string]sentOrder{}, refused: map[string]int{}, paid: map[string]string{},
		unpayable: map[string]string{}, refunds: map[string]string{}, cancelled: map[string]bool{},
		claims: map[int64]bool{}, tokens: map[string]string{}, ops: map[string]int{}}
}

func (l *ledger) contradiction(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.contradictions = append(l.contradictions, fmt.Sprintf(format, args...))
}

func (l *ledger) op(kind string) {
	l.mu.Lock()
	l.ops[kind]++
	l.mu.Unlock()
}

// traffic runs the shop's operations through lb and keeps the ledger.
type traffic struct {
	lb    *lb
	led   *ledger
	users int64 // the first user ID; users are users, users+1, …
	seq   atomic.Int64
}

func newTraffic(bases []string, fig *figures) *traffic {
	return &traffic{lb: newLB(bases, fig), led: newLedger(), users: 1 + rand.Int64N(1<<40)}
}

// scenario is one customer's visit: maybe a coupon claim, an order
// (maybe through a submit token, maybe sent twice at once), then a
// payment (its callback sent three times, two of them at once) and maybe
// a refund (sent again, with the same and with another key), or a
// cancellation (maybe twice, maybe followed by a late payment), or
// nothing (the close job closes it).
func (tr *traffic) scenario(user int64) {
	n := tr.seq.Add(1)
	useCoupon := false
	if rand.IntN(4) == 0 {
		a, err := tr.lb.post(call{path: "/coupons/1/claim", user: user})
		if err == nil {
			tr.led.op("claim")
			if a.status/100 == 2 {
				var c shop.Claim
				json.Unmarshal(a.body, &c)
				useCoupon = c.Status == "UNUSED"
				tr.led.mu.Lock()
				tr.led.claims[user] = true
				tr.led.mu.Unlock()
			}
		}
	}
	want := sentOrder{user: user, sku: "PLENTY", quantity: 1 + rand.IntN(3), coupon: useCoupon}
	if rand.IntN(2) == 0 {
		want.sku = "LIMITED"
	}
	if rand.IntN(4) == 0 {
		a, err := tr.lb.post(call{path: "/tokens", user: user})
		if err == nil && a.status == http.StatusCreated {
			var tok struct{ Token string }
			json.Unmarshal(a.body, &tok)
			want.token = tok.Token
		}
	}
	body := fmt.Sprintf(`{"sku":%q,"quantity":%d}`, want.sku, want.quantity)
	if useCoupon {
		body = fmt.Sprintf(`{"sku":%q,"quantity":%d,"coupon_id":1}`, want.sku, want.quantity)
	}
	cl := call{path: "/orders", user: user, key: fmt.Sprintf("o-%d-%d", user, n), token: want.token, body: []byte(body)}
	a, ok := tr.order(cl, want, rand.IntN(6) == 0)
	if !ok {
		return
	}
	var o shop.Order
	json.Unmarshal(a.body, &o)
	switch r := rand.IntN(20); {
	case r < 11:
		if tr.pay(o) && r < 5 {
			tr.refund(o)
		}
	case r < 15:
		tr.cancel(o, r == 13)
		if r == 14 {
			tr.pay(o) // after the cancel: 409 ORDER_NOT_PAYABLE
		}
	}
}

// order places the order cl, sent twice at once when twice; it reports
// whether an order was created and the answer.
func (tr *traffic) order(cl call, want sentOrder, twice bool) (answer, bool) {
	var answers []answer
	if twice {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range 2 {
			wg.Go(func() {
				if a, err := tr.lb.post(cl); err == nil {
					mu.Lock()
					answers = append(answers, a)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	} else if a, err := tr.lb.post(cl); err == nil {
		answers = append(answers, a)
	}
	if len(answers) == 0 {
		return answer{}, false
	}
	tr.led.op("order")
	first := answers[0]
	var o shop.Order
	json.Unmarshal(first.body, &o)
	for _, a := range answers[1:] {
		var other shop.Order
		json.Unmarshal(a.body, &other)
		if a.status != first.status || other.OrderNo != o.OrderNo {
			tr.led.contradiction("key %s: answered %d %s and %d %s", cl.key, first.status, first.body, a.status, a.body)
		}
	}
	tr.led.mu.Lock()
	defer tr.led.mu.Unlock()
	if first.status != http.StatusCreated {
		tr.led.refused[cl.key] = first.status
		return first, false
	}
	if o.OrderNo == "" || o.UserID != want.user || o.SKU != want.sku || o.Quantity != want.quantity || (o.CouponID == 1) != want.coupon {
		tr.led.contradictions = append(tr.led.contradictions, fmt.Sprintf("key %s: 201 %s for %+v", cl.key, first.body, want))
	}
	want.orderNo = o.OrderNo
	tr.led.orders[cl.key] = want
	if want.token != "" {
		tr.led.tokens[want.token] = o.OrderNo
	}
	return first, true
}

// pay sends o's payment callback three times, as providers do (two at
// once); it reports whether the payment was answered 200.
func (tr *traffic) pay(o shop.Order) bool {
	trade := "T-" + o.OrderNo
	cl := call{path: "/payments/callback", signed: true,
		body: fmt.Appendf(nil, `{"order_no":%q,"trade_no":%q,"amount_cents":%d,"status":"SUCCESS"}`, o.OrderNo, trade, o.AmountCents)}
	var answers []answer
	var mu sync.Mutex
	send := func() {
		if a, err := tr.lb.post(cl); err == nil {
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	wg.Go(send)
	wg.Go(send)
	wg.Wait()
	send()
	if len(answers) == 0 {
		return false
	}
	tr.led.op("payment")
	for _, a := range answers[1:] {
		if a.status != answers[0].status {
			tr.led.contradiction("trade %s: answered %d %s and %d %s", trade, answers[0].status, answers[0].body, a.status, a.body)
		}
	}
	tr.led.mu.Lock()
	defer tr.led.mu.Unlock()
	switch answers[0].status {
	case http.StatusOK:
		tr.led.paid[trade] = o.OrderNo
		return true
	case http.StatusConflict:
		tr.led.unpayable[trade] = o.OrderNo
	default:
		tr.led.contradictions = append(tr.led.contradictions, fmt.Sprintf("trade %s: answered %d %s", trade, answers[0].status, answers[0].body))
	}
	return false
}

// refund refunds o, maybe again with the same key, maybe with another.
func (tr *traffic) refund(o shop.Order) {
	key := "r-" + o.OrderNo
	path := "/orders/" + o.OrderNo + "/refunds"
	var refundNos []string
	for i := range 1 + rand.IntN(3) {
		if i == 2 {
			key += "-again" // another key: the refund that is there
		}
		a, err := tr.lb.post(call{path: path, user: o.UserID, key: key})
		if err != nil {
			return
		}
		tr.led.op("refund")
		if a.status/100 != 2 {
			tr.led.contradiction("refund of %s: %d %s", o.OrderNo, a.status, a.body)
			return
		}
		var r shop.Refund
		json.Unmarshal(a.body, &r)
		refundNos = append(refundNos, r.RefundNo)
	}
	for _, no := range refundNos[1:] {
		if no != refundNos[0] {
			tr.led.contradiction("refund of %s: refunds %q", o.OrderNo, refundNos)
		}
	}
	tr.led.mu.Lock()
	tr.led.refunds[o.OrderNo] = refundNos[0]
	tr.led.mu.Unlock()
}

// cancel cancels o, twice when twice.
func (tr *traffic) cancel(o shop.Order, twice bool) {
	for range 1 + btoi(twice) {
		a, err := tr.lb.post(call{path: "/orders/" + o.OrderNo + "/cancel", user: o.UserID})
		if err != nil {
			return
		}
		tr.led.op("cancel")
		if a.status == http.StatusOK {
			tr.led.mu.Lock()
			tr.led.cancelled[o.OrderNo] = true
			tr.led.mu.Unlock()
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// runWorkers runs workers customers, one scenario after another, each
// for one of 8 users of its own, until stop is closed; it returns when
// every scenario ended.
func (tr *traffic) runWorkers(workers int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				user := tr.users + int64(w*8+rand.IntN(8))
				select {
				case <-stop:
					return
				default:
				}
				tr.scenario(user)
				time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
}

// runRate starts rate scenarios a second, for users taken in turn from a
// pool of users, at most maxInFlight at once (a start beyond is counted
// in skipped), until stop is closed; it returns when every scenario
// ended.
func (tr *traffic) runRate(rate float64, users int, maxInFlight int64, stop <-chan struct{}) (started, skipped int64) {
	var wg sync.WaitGroup
	var inFlight atomic.Int64
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for i := int64(0); ; i++ {
		select {
		case <-stop:
			wg.Wait()
			return started, skipped
		case <-tick.C:
		}
		if inFlight.Load() >= maxInFlight {
			skipped++
			continue
		}
		started++
		inFlight.Add(1)
		user := tr.users + i%int64(users)
		wg.Go(func() {
			defer inFlight.Add(-1)
			tr.scenario(user)
		})
	}
}
