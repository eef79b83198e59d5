package shop_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem/internal/testenv"
)

// chromiumVar names a Chromium (or Chrome) binary for the browser test;
// by default it is /usr/bin/chromium, or chromium on PATH.
const chromiumVar = "IDEM_CHROMIUM"

// screenshotVar, when set, makes the browser test save a screenshot of
// the checkout page there (the README's docs/checkout.png is made so).
const screenshotVar = "IDEM_SCREENSHOT"

// needChromium returns the path of Chromium, or skips t (fails it under
// IDEM_REQUIRE_SERVICES=1) naming IDEM_CHROMIUM.
func needChromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv(chromiumVar)
	if path == "" {
		path = "/usr/bin/chromium"
		if _, err := os.Stat(path); err != nil {
			if p, err := exec.LookPath("chromium"); err == nil {
				path = p
			}
		}
	}
	if _, err := os.Stat(path); err != nil {
		msg := fmt.Sprintf("Chromium not found (set %s to its path; apt-get install chromium): %v", chromiumVar, err)
		if os.Getenv(testenv.RequireVar) == "1" {
			t.Fatalf("%s; %s=1 makes this a failure", msg, testenv.RequireVar)
		}
		t.Skip(msg)
	}
	return path
}

// TestBrowserCheckout drives headless Chromium through the checkout page
// on each backend, doing what users do to a form: triple-click its
// button, go back and submit it again, reload the order page, and pay
// twice (the second time with scripts off, double-clicking). The database
// then holds one order and one payment.
func TestBrowserCheckout(t *testing.T) {
	chromium := needChromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		// Back shows pages from the HTTP cache, as a browser whose
		// back/forward cache holds no page does; chromedp loses track of
		// a document the back/forward cache restores.
		chromedp.Flag("disable-features", "BackForwardCache"),
		chromedp.WindowSize(1000, 900),
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	browser, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(browser); err != nil { // starts the browser
		t.Fatalf("start %s: %v", chromium, err)
	}
	// One browser, one tab per backend, one backend at a time (each
	// Chromium renderer is heavy).
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { testBrowserCheckout(t, b, browser) })
	}
}

func testBrowserCheckout(t *testing.T, b backend, browser context.Context) {
	s, db := webShop(t, b)
	// Count the form posts the shop gets.
	var posts struct{ checkout, pay atomic.Int64 }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			switch {
			case r.URL.Path == "/checkout":
				posts.checkout.Add(1)
			case strings.HasSuffix(r.URL.Path, "/pay"):
				posts.pay.Add(1)
			}
		}
		s.ServeHTTP(w, r)
	}))
	defer srv.Close()
	tab, cancel := chromedp.NewContext(browser)
	defer cancel()
	if err := chromedp.Do(tab); err != nil { // opens the tab, without a deadline
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	scripts := func(on bool) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: !on})
			return err
		})
	}
	center := func(id string) (float64, float64) {
		t.Helper()
		xy, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => { const r = document.getElementById('`+id+`').getBoundingClientRect(); return [r.x + r.width/2, r.y + r.height/2]; })()`))
		if err != nil || len(xy) != 2 {
			t.Fatalf("locate #%s: %v %v", id, xy, err)
		}
		return xy[0], xy[1]
	}
	orderURL := func() string {
		t.Helper()
		do("wait for the order page", chromedp.WaitVisible(chromedp.ID("order-no")))
		loc, err := chromedp.Run(ctx, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}

	// Sign in as user 21 and fill the form.
	do("open the shop",
		chromedp.Navigate(srv.URL+"/?uid=21"),
		chromedp.WaitVisible(chromedp.ID("buy")),
		chromedp.SetValue(chromedp.ID("sku"), "SKU-1"),
		chromedp.SetValue(chromedp.ID("quantity"), "2"),
	)
	if who, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("user"))); err != nil || who != "user 21" {
		t.Fatalf("signed in as %q (%v), want user 21", who, err)
	}
	if path := os.Getenv(screenshotVar); path != "" && b.name == "sqlite" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("checkout page saved to %s", path)
	}

	// Triple-click the button: the script disables it on the first
	// submit, and the token would make any later submission lead to the
	// same order anyway.
	x, y := center("buy")
	do("triple-click", chromedp.MouseClickXY(x, y), chromedp.MouseClickXY(x, y), chromedp.MouseClickXY(x, y))
	first := orderURL()
	if !strings.Contains(first, "/orders/ord_") {
		t.Fatalf("after checkout the browser is at %s", first)
	}
	orderNo := first[strings.LastIndex(first, "/")+1:]
	wantRows(t, db, "after the triple click", 1, 0)

	// Back to the form, which still holds its token, and submit it again.
	do("go back", chromedp.NavigateBack(), chromedp.WaitVisible(chromedp.ID("buy")))
	do("resubmit", chromedp.Click(chromedp.ID("buy")))
	if again := orderURL(); again != first {
		t.Fatalf("the resubmitted form led to %s, want %s", again, first)
	}
	wantRows(t, db, "after back and resubmit", 1, 0)

	// Reload the 303's target: a GET, nothing happens.
	do("reload", chromedp.Reload())
	if again := orderURL(); again != first {
		t.Fatalf("after reload at %s", again)
	}
	wantRows(t, db, "after reload", 1, 0)

	// Pay with a double click and scripts off: the button stays enabled,
	// and each click may post the form.
	do("wait for pay", chromedp.WaitVisible(chromedp.ID("pay")))
	x, y = center("pay")
	do("double-click pay without scripts", scripts(false), chromedp.MouseClickXY(x, y), chromedp.MouseClickXY(x, y), scripts(true))
	do("paid", chromedp.WaitVisible(chromedp.CSS("#status.PAID")))
	wantRows(t, db, "after paying", 1, 1)

	// Pay again if the second click did not post (it may land after the
	// first post has navigated away): a script posts the page's form.
	if posts.pay.Load() < 2 {
		post := chromedp.Evaluate[bool](`(() => { const f = document.createElement('form'); f.method = 'post'; f.action = location.pathname + '/pay'; document.body.append(f); f.submit(); return true; })()`)
		if _, err := chromedp.Run(ctx, post); err != nil {
			t.Fatalf("pay again: %v", err)
		}
	}
	do("paid again", chromedp.WaitVisible(chromedp.CSS("#status.PAID")))
	if n := posts.pay.Load(); n < 2 {
		t.Fatalf("the shop got %d payment posts, want 2 or more", n)
	}
	if n := posts.checkout.Load(); n < 2 {
		t.Fatalf("the shop got %d checkout posts, want 2 or more", n)
	}
	t.Logf("the shop got %d checkout and %d payment posts", posts.checkout.Load(), posts.pay.Load())
	wantRows(t, db, "after paying twice", 1, 1)
	var amount int
	if err := db.QueryRow("SELECT amount_cents FROM shop_payments WHERE order_no = '" + orderNo + "'").Scan(&amount); err != nil || amount != 2*1299 {
		t.Fatalf("payment amount %d (err %v), want %d", amount, err, 2*1299)
	}
	if n := stock(t, db, "SKU-1"); n != 98 {
		t.Fatalf("stock %d, want 98", n)
	}
	// Both payments were the shop's signed callbacks of one simulated
	// trade (derived from the order): replayed or found paid, never
	// refused into the reconciliation table.
	var trade string
	if err := db.QueryRow("SELECT trade_no FROM shop_payments WHERE order_no = '" + orderNo + "'").Scan(&trade); err != nil || !strings.HasPrefix(trade, "sim_") || len(trade) != len("sim_")+24 {
		t.Fatalf("trade_no %q (err %v), want the simulated trade sim_<24 hex>", trade, err)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM shop_reconciliations"); n != 0 {
		t.Fatalf("%d reconciliations, want 0", n)
	}
}

// wantRows checks the numbers of orders and payments.
func wantRows(t *testing.T, db *sql.DB, when string, orders, payments int) {
	t.Helper()
	if n := count(t, db, "SELECT COUNT(*) FROM shop_orders"); n != orders {
		t.Fatalf("%s: %d orders, want %d", when, n, orders)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM shop_payments"); n != payments {
		t.Fatalf("%s: %d payments, want %d", when, n, payments)
	}
}
