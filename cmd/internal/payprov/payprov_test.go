package payprov_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/payprov/payprovtest"
)

// setup starts a provider configured by cfg and returns a client of it.
func setup(t *testing.T, cfg *payprov.Config) (*payprov.Client, *payprov.Server) {
	t.Helper()
	return payprovtest.Start(t, cfg)
}

var refund = payprov.RefundRequest{Payment: "pay_1", AmountCents: 1299, Currency: "EUR", Reason: "requested_by_customer"}

func ledger(t *testing.T, c *payprov.Client, kind payprov.Kind) payprov.Ledger {
	t.Helper()
	l, err := c.Ledger(context.Background(), kind)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// keyState is what the provider knows of key, first used for kind.
func keyState(t *testing.T, c *payprov.Client, kind payprov.Kind, key string) payprov.KeyState {
	t.Helper()
	for _, k := range ledger(t, c, kind).Keys {
		if k.IdempotencyKey == key {
			return k
		}
	}
	return payprov.KeyState{IdempotencyKey: key}
}

// refunds returns the refunds made, each under its key.
func refunds(t *testing.T, c *payprov.Client) map[string]payprov.Refund {
	t.Helper()
	out := map[string]payprov.Refund{}
	for _, e := range ledger(t, c, payprov.KindRefund).Effects {
		var r payprov.Refund
		if err := json.Unmarshal(e.Object, &r); err != nil {
			t.Fatal(err)
		}
		if r.ID != e.ID {
			t.Fatalf("effect %s holds the refund %s", e.ID, r.ID)
		}
		if _, dup := out[e.IdempotencyKey]; dup {
			t.Fatalf("two refunds under the key %q", e.IdempotencyKey)
		}
		out[e.IdempotencyKey] = r
	}
	return out
}

// wantOneRefund checks that the provider made exactly one refund, under
// key, and returns it.
func wantOneRefund(t *testing.T, c *payprov.Client, key string) payprov.Refund {
	t.Helper()
	all := refunds(t, c)
	r, ok := all[key]
	if len(all) != 1 || !ok {
		t.Fatalf("refunds made: %+v; want one under %q", all, key)
	}
	return r
}

// retryRefund refunds under key and checks that the provider answers with
// the one refund it made, under key.
func retryRefund(t *testing.T, c *payprov.Client, key string) payprov.Refund {
	t.Helper()
	got, err := c.Refund(context.Background(), key, refund)
	if err != nil {
		t.Fatal(err)
	}
	if made := wantOneRefund(t, c, key); got != made {
		t.Fatalf("answered %+v; made %+v", got, made)
	}
	return got
}

// waitFor polls cond until it holds; it fails the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// post sends body to path with key and returns the answer.
func post(t *testing.T, c *payprov.Client, path, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.BaseURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(raw)
}

func TestReplay(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	first, err := c.Refund(context.Background(), "k1", refund)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first.ID, "re_") || first.Status != "succeeded" || first.AmountCents != 1299 || first.Payment != "pay_1" {
		t.Fatalf("refund %+v", first)
	}
	// The same request, its members in another order and spaced out.
	resp, body := post(t, c, "/v1/refunds", "k1",
		` {"currency":"EUR", "reason":"requested_by_customer","amount_cents":1299,"payment":"pay_1"} `)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d, Idempotent-Replayed %q", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	var again payprov.Refund
	if err := json.Unmarshal([]byte(body), &again); err != nil || again != first {
		t.Fatalf("replay %s (%v); want %+v", body, err, first)
	}
	if got := wantOneRefund(t, c, "k1"); got != first {
		t.Fatalf("recorded %+v; answered %+v", got, first)
	}
	if k := keyState(t, c, payprov.KindRefund, "k1"); k.Requests != 2 || k.State != "done" || k.Status != 201 {
		t.Fatalf("key %+v", k)
	}
}

func TestKeyReused(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	ctx := context.Background()
	if _, err := c.Refund(ctx, "k1", refund); err != nil {
		t.Fatal(err)
	}
	other := refund
	other.AmountCents++
	_, err := c.Refund(ctx, "k1", other)
	if !errors.Is(err, payprov.ErrKeyReused) || payprov.Retryable(err) {
		t.Fatalf("another body under the key: %v; want ErrKeyReused, not retryable", err)
	}
	_, err = c.Charge(ctx, "k1", payprov.ChargeRequest{AmountCents: 1299, Currency: "EUR", Source: "tok_visa"})
	if !errors.Is(err, payprov.ErrKeyReused) {
		t.Fatalf("another endpoint under the key: %v; want ErrKeyReused", err)
	}
	wantOneRefund(t, c, "k1")
	if n := len(ledger(t, c, payprov.KindCharge).Effects); n != 0 {
		t.Fatalf("%d charges made", n)
	}
}

func TestMalformedRequestsStoreNothing(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	for _, tc := range []struct{ name, key, body string }{
		{"no key", "", `{"payment":"pay_1","amount_cents":1299,"currency":"EUR"}`},
		{"key with a tab", "k\t1", `{"payment":"pay_1","amount_cents":1299,"currency":"EUR"}`},
		{"key not UTF-8", "k\xff", `{"payment":"pay_1","amount_cents":1299,"currency":"EUR"}`},
		{"key too long", strings.Repeat("k", 256), `{"payment":"pay_1","amount_cents":1299,"currency":"EUR"}`},
		{"unknown member", "k1", `{"payment":"pay_1","amount_cents":1299,"currency":"EUR","amount":1}`},
		{"zero amount", "k1", `{"payment":"pay_1","amount_cents":0,"currency":"EUR"}`},
		{"no currency", "k1", `{"payment":"pay_1","amount_cents":1299}`},
		{"two values", "k1", `{"payment":"pay_1","amount_cents":1299,"currency":"EUR"} {}`},
		{"not JSON", "k1", `payment=pay_1`},
	} {
		resp, body := post(t, c, "/v1/refunds", tc.key, tc.body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":"`) {
			t.Errorf("%s: %d %s; want 400 with a code", tc.name, resp.StatusCode, body)
		}
	}
	_, err := c.Refund(context.Background(), "", refund)
	var se *payprov.StatusError
	if !errors.As(err, &se) || se.StatusCode != 400 || payprov.Retryable(err) {
		t.Fatalf("a refund without a key: %v; want 400, not retryable", err)
	}
	if k := keyState(t, c, payprov.KindRefund, "k1"); k.State != "" || k.Requests != 5 {
		t.Fatalf("key after malformed requests: %+v; want free, 5 requests", k)
	}
	retryRefund(t, c, "k1")
}

func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	const n = 50
	var (
		wg        sync.WaitGroup
		start     = make(chan struct{})
		mu        sync.Mutex
		ids       = map[string]int{}
		conflicts int
	)
	for range n {
		wg.Go(func() {
			<-start
			r, err := c.Refund(context.Background(), "same", refund)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ids[r.ID]++
			case errors.Is(err, payprov.ErrInProgress) && payprov.Retryable(err):
				conflicts++
			default:
				t.Errorf("refund: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	made := wantOneRefund(t, c, "same")
	if len(ids) != 1 || ids[made.ID]+conflicts != n {
		t.Fatalf("answers: %v and %d conflicts; want %s or 409 each", ids, conflicts, made.ID)
	}
	if k := keyState(t, c, payprov.KindRefund, "same"); k.Requests != n {
		t.Fatalf("key %+v; want %d requests", k, n)
	}
}

// TestInProgress holds a request's key with a delay and checks that a
// second request with the key gets 409 and makes nothing, and that the
// key is free again when the first one's client goes.
func TestInProgress(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	if err := c.SetFault(context.Background(), payprov.Fault{Path: "/v1/refunds", Mode: payprov.FaultDelay, Count: 1, DelayMS: 3_600_000}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := c.Refund(ctx, "k1", refund)
		first <- err
	}()
	waitFor(t, "the first request to hold the key", func() bool {
		return keyState(t, c, payprov.KindRefund, "k1").State == "in_progress"
	})
	resp, body := post(t, c, "/v1/refunds", "k1", `{"payment":"pay_1","amount_cents":1299,"currency":"EUR","reason":"requested_by_customer"}`)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, `"request_in_progress"`) {
		t.Fatalf("second request: %d %s; want 409 request_in_progress", resp.StatusCode, body)
	}
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) || !payprov.Retryable(err) {
		t.Fatalf("first request: %v; want context.Canceled, retryable", err)
	}
	waitFor(t, "the key to be free", func() bool {
		return keyState(t, c, payprov.KindRefund, "k1").State == ""
	})
	if n := len(refunds(t, c)); n != 0 {
		t.Fatalf("%d refunds made by abandoned requests", n)
	}
	retryRefund(t, c, "k1")
}

func TestFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode payprov.FaultMode
		// interrupt, when set, ends the faulty call once it holds: the
		// test cancels its context when interrupt reports true.
		interrupt func(t *testing.T, c *payprov.Client) bool
		check     func(t *testing.T, err error)
		// madeBefore is how many refunds the faulty call made.
		madeBefore int
	}{
		{mode: payprov.FaultFail, check: func(t *testing.T, err error) {
			var se *payprov.StatusError
			if !errors.As(err, &se) || se.StatusCode != 500 || !payprov.Retryable(err) {
				t.Fatalf("%v; want a retryable 500", err)
			}
		}},
		{mode: payprov.FaultHang, interrupt: func(t *testing.T, c *payprov.Client) bool {
			return keyState(t, c, payprov.KindRefund, "k1").Requests == 1
		}, check: wantCanceled},
		{mode: payprov.FaultTimeoutAfterEffect, madeBefore: 1, interrupt: func(t *testing.T, c *payprov.Client) bool {
			return len(refunds(t, c)) == 1
		}, check: wantCanceled},
		{mode: payprov.FaultDelay, madeBefore: 1, check: func(t *testing.T, err error) {
			if err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			t.Parallel()
			c, _ := setup(t, nil)
			if err := c.SetFault(context.Background(), payprov.Fault{Path: "/v1/refunds", Mode: tc.mode, Count: 1, DelayMS: 20}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			result := make(chan error, 1)
			go func() {
				_, err := c.Refund(ctx, "k1", refund)
				result <- err
			}()
			if tc.interrupt != nil {
				waitFor(t, "the fault to hold the call", func() bool { return tc.interrupt(t, c) })
				cancel()
			}
			tc.check(t, <-result)
			if n := len(refunds(t, c)); n != tc.madeBefore {
				t.Fatalf("%d refunds made by the faulty call; want %d", n, tc.madeBefore)
			}
			before := refunds(t, c)["k1"]
			// The retry with the key: the fault is spent.
			if made := retryRefund(t, c, "k1"); tc.madeBefore == 1 && made != before {
				t.Fatalf("retry made or answered %+v; before the retry %+v", made, before)
			}
		})
	}
}

func wantCanceled(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, context.Canceled) || !payprov.Retryable(err) {
		t.Fatalf("%v; want context.Canceled, retryable", err)
	}
}

func TestFaultRefuseIsStored(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	ctx := context.Background()
	if err := c.SetFault(ctx, payprov.Fault{Mode: payprov.FaultRefuse, Count: 1}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := c.Refund(ctx, "k1", refund)
		var refused *payprov.RefusedError
		if !errors.As(err, &refused) || refused.Code != "refund_refused" || payprov.Retryable(err) {
			t.Fatalf("%v; want refund_refused, not retryable", err)
		}
	}
	resp, _ := post(t, c, "/v1/refunds", "k1", `{"payment":"pay_1","amount_cents":1299,"currency":"EUR","reason":"requested_by_customer"}`)
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("third request: %d; want a replayed 402", resp.StatusCode)
	}
	if n := len(refunds(t, c)); n != 0 {
		t.Fatalf("%d refunds made", n)
	}
	if k := keyState(t, c, payprov.KindRefund, "k1"); k.State != "done" || k.Status != 402 || k.Requests != 3 {
		t.Fatalf("key %+v", k)
	}
	// Another key is not refused: the fault was for one request.
	if _, err := c.Refund(ctx, "k2", refund); err != nil {
		t.Fatal(err)
	}
	wantOneRefund(t, c, "k2")
}

func TestFaultQueue(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	ctx := context.Background()
	for _, f := range []payprov.Fault{
		{Path: "/v1/charges", Mode: payprov.FaultFail}, // other path, forever
		{Path: "/v1/refunds", Mode: payprov.FaultFail, Count: 2},
		{Mode: payprov.FaultRefuse, Count: 1},
	} {
		if err := c.SetFault(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	var statuses []int
	for range 4 {
		_, err := c.Refund(ctx, "k1", refund)
		var se *payprov.StatusError
		var refused *payprov.RefusedError
		switch {
		case err == nil:
			statuses = append(statuses, 201)
		case errors.As(err, &se):
			statuses = append(statuses, se.StatusCode)
		case errors.As(err, &refused):
			statuses = append(statuses, 402)
		default:
			t.Fatal(err)
		}
	}
	if got, want := statuses, []int{500, 500, 402, 402}; !slices.Equal(got, want) {
		t.Fatalf("statuses %v; want %v", got, want)
	}
	charge := payprov.ChargeRequest{AmountCents: 100, Currency: "EUR", Source: "tok_visa"}
	if _, err := c.Charge(ctx, "c1", charge); !payprov.Retryable(err) {
		t.Fatalf("charge: %v; want the fault's 500", err)
	}
	if err := c.ClearFaults(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Charge(ctx, "c1", charge); err != nil {
		t.Fatal(err)
	}
	if n := len(ledger(t, c, payprov.KindCharge).Effects); n != 1 {
		t.Fatalf("%d charges made", n)
	}
	for _, bad := range []payprov.Fault{{Mode: "explode"}, {Mode: payprov.FaultFail, Path: "/v1/nothing"}, {Mode: payprov.FaultFail, Count: -1}} {
		if err := c.SetFault(ctx, bad); err == nil {
			t.Errorf("fault %+v accepted", bad)
		}
	}
}

// TestCloseEndsHangs checks that Close ends the requests held by faults.
func TestCloseEndsHangs(t *testing.T) {
	t.Parallel()
	c, srv := setup(t, nil)
	if err := c.SetFault(context.Background(), payprov.Fault{Mode: payprov.FaultTimeoutAfterEffect}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Refund(context.Background(), "k1", refund)
		done <- err
	}()
	waitFor(t, "the refund", func() bool { return len(refunds(t, c)) == 1 })
	srv.Close()
	if err := <-done; err == nil || !payprov.Retryable(err) {
		t.Fatalf("%v; want a retryable error", err)
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, &payprov.Config{RefundLimitCents: 2000})
	ctx := context.Background()
	for _, p := range []payprov.Payment{{Payment: "pay_paid", AmountCents: 1000}, {Payment: "pay_final", NonRefundable: true}} {
		if err := c.RegisterPayment(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		key, payment string
		cents        int64
		refused      bool
	}{
		{"a1", "pay_paid", 600, false},
		{"a2", "pay_paid", 600, true}, // 1200 > 1000
		{"a3", "pay_paid", 400, false},
		{"a2", "pay_paid", 600, true}, // replayed
		{"b1", "pay_final", 1, true},
		{"c1", "pay_unknown", 2000, false},
		{"c2", "pay_unknown", 1, true}, // over the server's limit
	} {
		_, err := c.Refund(ctx, tc.key, payprov.RefundRequest{Payment: tc.payment, AmountCents: tc.cents, Currency: "EUR"})
		var refused *payprov.RefusedError
		if got := errors.As(err, &refused); got != tc.refused || (err != nil && !got) {
			t.Fatalf("refund %s of %d under %s: %v; want refused %v", tc.payment, tc.cents, tc.key, err, tc.refused)
		}
		if tc.refused && refused.Code != "refund_refused" {
			t.Fatalf("code %q", refused.Code)
		}
	}
	// A refusal stays the key's answer when the rule would allow it now.
	if err := c.RegisterPayment(ctx, payprov.Payment{Payment: "pay_paid", AmountCents: 5000}); err != nil {
		t.Fatal(err)
	}
	var refused *payprov.RefusedError
	if _, err := c.Refund(ctx, "a2", payprov.RefundRequest{Payment: "pay_paid", AmountCents: 600, Currency: "EUR"}); !errors.As(err, &refused) {
		t.Fatalf("replay of a refusal: %v", err)
	}
	made := refunds(t, c)
	if len(made) != 3 || made["a1"].AmountCents != 600 || made["a3"].AmountCents != 400 || made["c1"].AmountCents != 2000 {
		t.Fatalf("refunds made: %+v", made)
	}
}

// TestChargeThenShip is the second flow: two foreign calls in a row.
func TestChargeThenShip(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, nil)
	ctx := context.Background()
	_, err := c.Charge(ctx, "o1-charge", payprov.ChargeRequest{AmountCents: 100, Currency: "EUR", Source: payprov.DeclinedSource})
	var refused *payprov.RefusedError
	if !errors.As(err, &refused) || refused.Code != "card_declined" {
		t.Fatalf("declined card: %v", err)
	}
	ch, err := c.Charge(ctx, "o2-charge", payprov.ChargeRequest{AmountCents: 2599, Currency: "EUR", Source: "tok_visa", Description: "order o2"})
	if err != nil || !strings.HasPrefix(ch.ID, "ch_") || ch.Status != "succeeded" {
		t.Fatalf("charge %+v, %v", ch, err)
	}
	if err := c.SetFault(ctx, payprov.Fault{Path: "/v1/shipments", Mode: payprov.FaultFail, Count: 1}); err != nil {
		t.Fatal(err)
	}
	ship := payprov.ShipmentRequest{Order: "o2", Address: "1 Rue de Rivoli, Paris"}
	if _, err := c.Ship(ctx, "o2-ship", ship); !payprov.Retryable(err) {
		t.Fatalf("shipment: %v; want the fault's 500", err)
	}
	sh, err := c.Ship(ctx, "o2-ship", ship)
	if err != nil || !strings.HasPrefix(sh.ID, "shp_") || sh.TrackingNumber == "" || sh.Order != "o2" {
		t.Fatalf("shipment %+v, %v", sh, err)
	}
	again, err := c.Ship(ctx, "o2-ship", ship)
	if err != nil || again != sh {
		t.Fatalf("replayed shipment %+v, %v; want %+v", again, err, sh)
	}
	charges, shipments := ledger(t, c, payprov.KindCharge), ledger(t, c, payprov.KindShipment)
	if len(charges.Effects) != 1 || charges.Effects[0].ID != ch.ID || len(shipments.Effects) != 1 || shipments.Effects[0].ID != sh.ID {
		t.Fatalf("charges %+v, shipments %+v", charges.Effects, shipments.Effects)
	}
	if len(shipments.Keys) != 1 || shipments.Keys[0].Requests != 3 {
		t.Fatalf("shipment keys %+v", shipments.Keys)
	}
}

func TestStatePersists(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/state.json"
	c, srv := setup(t, &payprov.Config{StatePath: path})
	ctx := context.Background()
	if err := c.RegisterPayment(ctx, payprov.Payment{Payment: "pay_1", AmountCents: 1299}); err != nil {
		t.Fatal(err)
	}
	first, err := c.Refund(ctx, "k1", refund)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	c2, _ := setup(t, &payprov.Config{StatePath: path})
	if again, err := c2.Refund(ctx, "k1", refund); err != nil || again != first {
		t.Fatalf("replay after restart: %+v, %v; want %+v", again, err, first)
	}
	var refused *payprov.RefusedError
	if _, err := c2.Refund(ctx, "k2", payprov.RefundRequest{Payment: "pay_1", AmountCents: 1, Currency: "EUR"}); !errors.As(err, &refused) {
		t.Fatalf("a refund over the payment after restart: %v; want refused", err)
	}
	wantOneRefund(t, c2, "k1")
}
