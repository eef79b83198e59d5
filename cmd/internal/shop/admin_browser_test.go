package shop_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

const adminToken = "operator-token-0123456789"

// TestBrowserAdmin drives headless Chromium through shopd's operator
// page: sign in with the token, evict a listed record (through its
// confirmation page) and see it gone from the page and the database;
// then retry a dead loyalty event (its handler failed every attempt)
// and see it processed: the points granted, its consume record
// succeeded.
func TestBrowserAdmin(t *testing.T) {
	chromium := needChromium(t)
	data := filepath.Join(t.TempDir(), "data")
	// The order.paid of the orders of user 77 fails while failing holds.
	var failing atomic.Bool
	failing.Store(true)
	shop.SetLoyaltyFailure(func(ev shop.OrderEvent) error {
		if ev.UserID == 77 && failing.Load() {
			return errors.New("points service down")
		}
		return nil
	})
	t.Cleanup(func() { shop.SetLoyaltyFailure(nil) })
	base, _ := runShopd(t, "-addr", "127.0.0.1:0", "-data", data, "-pay-secret", testPaySecret, "-admin-token", adminToken)
	db, err := sqlite.Open(t.Context(), filepath.Join(data, "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	// A record to evict: user 76's order.
	if r := do(t, "POST", base+"/orders", "76", "evict-me-76", `{"sku":"SKU-1","quantity":1}`); r.status != http.StatusCreated {
		t.Fatalf("create order: %d %s", r.status, r.body)
	}
	recordHash := idem.HashKey("user:76", "evict-me-76")
	// A dead message: user 77's order.paid fails its 5 attempts.
	orderNo := payOrder(t, base, 77)
	waitDead(t, base)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1200, 900),
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	tab, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(tab); err != nil {
		t.Fatalf("start %s: %v", chromium, err)
	}
	ctx, cancel := context.WithTimeout(tab, 90*time.Second)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('`+sel+`').length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	do("sign in",
		chromedp.Navigate(base+"/admin/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), adminToken),
		chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("records-section")),
	)
	recordRow := `tr.record[data-hash="` + recordHash + `"]`
	if n := count(recordRow); n == 0 {
		t.Fatal("the page does not list the order's record")
	}
	do("evict", chromedp.Click(chromedp.CSS(`button.evict[data-hash="`+recordHash+`"]`)), chromedp.WaitVisible(chromedp.ID("confirm")))
	if title, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("confirm-title"))); err != nil || !strings.Contains(title, recordHash) {
		t.Fatalf("confirmation %q (%v)", title, err)
	}
	if n := countRows(t, db, "SELECT COUNT(*) FROM idem_records WHERE idempotency_key = 'evict-me-76'"); n != 1 {
		t.Fatalf("%d records before the confirmation, want 1", n)
	}
	do("confirm the eviction", chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.ID("done")))
	if n := count(recordRow); n != 0 {
		t.Fatal("the evicted record is still listed")
	}
	if n := countRows(t, db, "SELECT COUNT(*) FROM idem_records WHERE idempotency_key = 'evict-me-76'"); n != 0 {
		t.Fatalf("%d records after the eviction, want 0", n)
	}

	// Retry the dead event, its handler now working.
	failing.Store(false)
	if n := count(`button.retry`); n != 1 {
		t.Fatalf("%d retry buttons, want 1", n)
	}
	do("retry", chromedp.Click(chromedp.CSS(`button.retry`)), chromedp.WaitVisible(chromedp.ID("confirm")))
	do("confirm the retry", chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.ID("done")))
	p := pollPoints(t, base, "77", func(p shop.Points) bool { return len(p.Ledger) > 0 })
	if want := shop.PointsFor(1299); p.Balance != want || len(p.Ledger) != 1 || p.Ledger[0].OrderNo != orderNo {
		t.Fatalf("points after the retry: %+v, want %d for %s", p, want, orderNo)
	}
	var dead, succeeded int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		dead = countRows(t, db, "SELECT COUNT(*) FROM idem_inbox WHERE status = 'dead'")
		succeeded = countRows(t, db, "SELECT COUNT(*) FROM idem_inbox WHERE status = 'succeeded'")
		if dead == 0 || time.Now().After(deadline) {
			break
		}
	}
	if dead != 0 || succeeded != 1 {
		t.Fatalf("consume records: %d dead, %d succeeded; want 0 and 1 (the retried message's)", dead, succeeded)
	}
	do("reload", chromedp.Navigate(base+"/admin/"), chromedp.WaitVisible(chromedp.ID("messages-section")))
	if n := count(`button.retry`); n != 0 {
		t.Fatalf("%d dead messages listed after the retry", n)
	}
}

// payOrder places and pays an order of one SKU-1 for user; it returns
// the order's number.
func payOrder(t *testing.T, base string, user int64) string {
	t.Helper()
	uid := fmt.Sprint(user)
	r := do(t, "POST", base+"/orders", uid, "order-"+uid, `{"sku":"SKU-1","quantity":1}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create order: %d %s", r.status, r.body)
	}
	var o shop.Order
	if err := json.Unmarshal([]byte(r.body), &o); err != nil {
		t.Fatal(err)
	}
	orderNo := o.OrderNo
	body := fmt.Sprintf(`{"order_no":%q,"trade_no":"T-%s","amount_cents":1299,"status":"SUCCESS"}`, orderNo, orderNo)
	req, _ := http.NewRequest("POST", base+"/payments/callback", strings.NewReader(body))
	req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(testPaySecret, time.Now(), []byte(body)))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("callback: %d", resp.StatusCode)
	}
	return orderNo
}

// waitDead reads the operator page (with the bearer token) until it
// lists a dead message, for at most 60 s (5 attempts, 15 s of backoff).
func waitDead(t *testing.T, base string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		req, _ := http.NewRequest("GET", base+"/admin/", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /admin/: %d", resp.StatusCode)
		}
		if strings.Contains(string(b), `class="retry"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no dead message after 60s")
		}
	}
}
