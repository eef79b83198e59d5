package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/sqlstore/sqlite"
)

// payprovMain, in the environment of the test binary, makes it run the
// payment provider (payprov.Main) with the rest of its arguments.
const payprovMain = "SHOPD_TEST_PAYPROV"

// runPayprovIfAsked runs the provider and exits when the environment asks
// for it (from TestMain).
func runPayprovIfAsked() {
	if os.Getenv(payprovMain) != "1" {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	status := payprov.Main(ctx, os.Args[2:], os.Stdout, os.Stderr) // drop -test.run
	stop()
	os.Exit(status)
}

// proc is a process of the test binary: a provider or a shopd.
type proc struct {
	cmd    *exec.Cmd
	url    string
	stderr string // the file of its stderr
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// startProc runs the test binary with env and args, and waits for the
// line of its stdout that starts with prefix and names its URL.
func startProc(t *testing.T, name string, env []string, prefix string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), stderr: filepath.Join(t.TempDir(), name+".stderr")}
	f, err := os.Create(p.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if rest, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				urls <- strings.Fields(rest)[0]
			}
		}
		io.Copy(io.Discard, stdout)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.stderr)
			t.Logf("%s's stderr:\n%s", name, b)
		}
	})
	select {
	case p.url = <-urls:
	case <-p.exited:
		t.Fatalf("%s exited before listening: %v", name, p.err)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start listening", name)
	}
	return p
}

// stop ends p with SIGINT and waits for it.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the process did not stop")
	}
}

// post sends a JSON POST with the shop's headers.
func post(t *testing.T, url, key, body string, header map[string]string) (int, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "1")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// crashRun is a provider process and a shopd on a SQLite file that kills
// itself (SIGKILL) after a step of an operation of steps.
type crashRun struct {
	provider *payprov.Client
	dir      string
	args     []string
	env      []string
	first    *proc
}

// startCrashRun starts a provider and a shopd that dies after step.
func startCrashRun(t *testing.T, step string) *crashRun {
	t.Helper()
	provider := startProc(t, "payprov", []string{payprovMain + "=1"}, "payprov listening on ", "-addr", "127.0.0.1:0")
	c := &crashRun{provider: &payprov.Client{BaseURL: provider.url}, dir: t.TempDir()}
	c.args = []string{"-addr", "127.0.0.1:0", "-data", c.dir, "-provider", provider.url, "-lease", "2s", "-complete-interval", "200ms", "-provider-timeout", "5s"}
	c.env = []string{"SHOPD_MAIN=1", "SHOPD_PROVIDER=", "SHOPD_PAY_SECRET=", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="}
	c.first = startProc(t, "shopd", append(c.env, "SHOPD_CRASH_AFTER_STEP="+step), "shopd listening on ", c.args...)
	return c
}

// order places an order of 2 BOOK-1 for user 1.
func (c *crashRun) order(t *testing.T) shop.Order {
	t.Helper()
	status, body, err := post(t, c.first.url+"/orders", "order-1", `{"sku":"BOOK-1","quantity":2}`, nil)
	if err != nil || status != http.StatusCreated {
		t.Fatalf("order: %d %s %v", status, body, err)
	}
	var o shop.Order
	if err := json.Unmarshal(body, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// crash posts body to path under key and checks that shopd died by its
// crash hook after step, without answering.
func (c *crashRun) crash(t *testing.T, path, key, body, step string) {
	t.Helper()
	if status, answer, err := post(t, c.first.url+path, key, body, nil); err == nil {
		t.Fatalf("%s was answered (%d %s); shopd should have died after step %s", path, status, answer, step)
	}
	<-c.first.exited
	var exit *exec.ExitError
	if !errors.As(c.first.err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("shopd ended with %v, want SIGKILL", c.first.err)
	}
	if !bytes.Contains(must(os.ReadFile(c.first.stderr)), []byte("killing myself after step "+step+"\n")) {
		t.Fatalf("shopd died, but not by its crash hook after %s", step)
	}
}

// restart starts shopd again on the same SQLite file, without the hook.
func (c *crashRun) restart(t *testing.T) *proc {
	t.Helper()
	return startProc(t, "shopd-2", c.env, "shopd listening on ", c.args...)
}

// db opens the shop's SQLite file (shopd may be running: readers do not
// block it).
func (c *crashRun) db(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(c.dir, "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// waitFor polls db until query counts 1: the completer finished.
func waitFor(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := db.QueryRow(query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the completer did not finish: %s is %d", query, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// retryUntilCreated retries the request, as a client would, until it is
// answered 201 (409 PROCESSING until the dead execution's lease ends),
// and decodes the answer into v.
func retryUntilCreated(t *testing.T, url, key, body string, v any) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		status, answer, err := post(t, url, key, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		if status == http.StatusCreated {
			if err := json.Unmarshal(answer, v); err != nil {
				t.Fatal(err)
			}
			return
		}
		if status != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("retry: %d %s", status, answer)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ledger returns the provider's only effect of kind, decoded into v.
func (c *crashRun) ledger(t *testing.T, kind payprov.Kind, v any) {
	t.Helper()
	l, err := c.provider.Ledger(context.Background(), kind)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Effects) != 1 {
		t.Fatalf("the provider made %d %s, want 1: %+v", len(l.Effects), kind, l.Effects)
	}
	if err := json.Unmarshal(l.Effects[0].Object, v); err != nil {
		t.Fatal(err)
	}
}

// counts runs each query (a count) on db.
func counts(t *testing.T, db *sql.DB, queries ...string) []int {
	t.Helper()
	ns := make([]int, len(queries))
	for i, q := range queries {
		if err := db.QueryRow(q).Scan(&ns[i]); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return ns
}

// must returns b, or nil when err is set (a missing log reads empty).
func must(b []byte, err error) []byte {
	if err != nil {
		return nil
	}
	return b
}

// A shopd killed (SIGKILL) right after each step of a refund, or right
// after the provider answered and before that answer's checkpoint, is
// restarted on its SQLite file; the client's retry with the same key, or
// the completer when nobody retries, finishes the refund: one refund at
// the provider (a process of its own, which outlives the kill), one
// refund row REFUNDED with the provider's id, one order.refunded event,
// the order REFUNDED.
func TestRefundSurvivesSIGKILLAfterEachStep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts shopd and a provider as processes")
	}
	for _, step := range []string{shop.StepRefunding, shop.StepProviderCall, shop.StepProvider, shop.StepRefunded} {
		for _, finisher := range []string{"retry", "completer"} {
			t.Run(step+"/"+finisher, func(t *testing.T) {
				t.Parallel()
				killRefund(t, step, finisher == "completer")
			})
		}
	}
}

func killRefund(t *testing.T, step string, byCompleter bool) {
	c := startCrashRun(t, step)
	o := c.order(t)
	// Paid by a signed callback: its trade is the payment the provider
	// refunds.
	const trade = "trade-kill-1"
	cb, _ := json.Marshal(map[string]any{"order_no": o.OrderNo, "trade_no": trade, "amount_cents": o.AmountCents, "status": shop.PaymentSuccess})
	status, body, err := post(t, c.first.url+"/payments/callback", "", string(cb), map[string]string{shop.PaySignatureHeader: shop.SignPayment(shop.DevPaySecret, time.Now(), cb)})
	if err != nil || status != http.StatusOK {
		t.Fatalf("payment callback: %d %s %v", status, body, err)
	}
	path := "/orders/" + o.OrderNo + "/refunds"
	c.crash(t, path, "refund-1", "", step)

	second := c.restart(t)
	db := c.db(t)
	if byCompleter {
		waitFor(t, db, `SELECT COUNT(*) FROM shop_orders WHERE status = 'REFUNDED' AND order_no = '`+o.OrderNo+`'`)
	}
	var ref shop.Refund
	retryUntilCreated(t, second.url+path, "refund-1", "", &ref)
	var made payprov.Refund
	c.ledger(t, payprov.KindRefund, &made)
	if made.Payment != trade || made.AmountCents != o.AmountCents || ref.ProviderRefundID != made.ID || ref.Status != shop.StatusRefunded {
		t.Fatalf("the provider's refund %+v, the shop's answer %+v", made, ref)
	}
	second.stop(t)
	got := counts(t, db,
		`SELECT COUNT(*) FROM shop_orders WHERE status = 'REFUNDED' AND order_no = '`+o.OrderNo+`'`,
		`SELECT COUNT(*) FROM shop_refunds WHERE order_no = '`+o.OrderNo+`'`,
		`SELECT COUNT(*) FROM shop_refunds WHERE status = 'REFUNDED' AND provider_refund_id = '`+made.ID+`'`,
		`SELECT COUNT(*) FROM idem_outbox WHERE topic = 'order.refunded' AND msg_key = '`+o.OrderNo+`'`)
	if fmt.Sprint(got) != "[1 1 1 1]" {
		t.Fatalf("order REFUNDED, refund rows, rows REFUNDED with the provider's id, order.refunded events: %v, want 1 each", got)
	}
	if bytes.Contains(must(os.ReadFile(second.stderr)), []byte("level=ERROR")) {
		t.Errorf("the restarted shopd logged errors")
	}
}

// A shopd killed after each step of a card checkout (and after each
// provider answer, before its checkpoint) is restarted; the retry, or the
// completer, finishes it: one charge, one shipment, the order PAID with
// one payment row (the charge), one shipment row, one order.paid.
func TestCardCheckoutSurvivesSIGKILLAfterEachStep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts shopd and a provider as processes")
	}
	for _, step := range []string{shop.StepCharging, shop.StepChargeCall, shop.StepCharge, shop.StepPaid, shop.StepShipCall, shop.StepShip, shop.StepShipped} {
		t.Run(step+"/retry", func(t *testing.T) {
			t.Parallel()
			killCheckout(t, step, false)
		})
	}
	for _, step := range []string{shop.StepChargeCall, shop.StepShipCall} {
		t.Run(step+"/completer", func(t *testing.T) {
			t.Parallel()
			killCheckout(t, step, true)
		})
	}
}

func killCheckout(t *testing.T, step string, byCompleter bool) {
	c := startCrashRun(t, step)
	o := c.order(t)
	path := "/orders/" + o.OrderNo + "/card-checkout"
	const body = `{"source":"tok_visa","address":"1 Main Street"}`
	c.crash(t, path, "checkout-1", body, step)

	second := c.restart(t)
	db := c.db(t)
	if byCompleter {
		waitFor(t, db, `SELECT COUNT(*) FROM shop_shipments WHERE order_no = '`+o.OrderNo+`'`)
	}
	var co shop.CardCheckout
	retryUntilCreated(t, second.url+path, "checkout-1", body, &co)
	var charge payprov.Charge
	c.ledger(t, payprov.KindCharge, &charge)
	var shipment payprov.Shipment
	c.ledger(t, payprov.KindShipment, &shipment)
	if charge.AmountCents != o.AmountCents || co.ChargeID != charge.ID || co.ShipmentID != shipment.ID || shipment.Order != o.OrderNo {
		t.Fatalf("the provider's charge %+v and shipment %+v, the shop's answer %+v", charge, shipment, co)
	}
	second.stop(t)
	got := counts(t, db,
		`SELECT COUNT(*) FROM shop_orders WHERE status = 'PAID' AND order_no = '`+o.OrderNo+`'`,
		`SELECT COUNT(*) FROM shop_payments WHERE trade_no = '`+charge.ID+`' AND order_no = '`+o.OrderNo+`'`,
		`SELECT COUNT(*) FROM shop_payments WHERE order_no = '`+o.OrderNo+`'`,
		`SELECT COUNT(*) FROM shop_shipments WHERE shipment_id = '`+shipment.ID+`' AND order_no = '`+o.OrderNo+`'`,
		`SELECT COUNT(*) FROM idem_outbox WHERE topic = 'order.paid' AND msg_key = '`+o.OrderNo+`'`)
	if fmt.Sprint(got) != "[1 1 1 1 1]" {
		t.Fatalf("order PAID, payment of the charge, payments, shipment rows, order.paid events: %v, want 1 each", got)
	}
}
