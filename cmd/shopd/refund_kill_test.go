package main

import (
	"bufio"
	"bytes"
	"context"
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
				killAfterStep(t, step, finisher == "completer")
			})
		}
	}
}

func killAfterStep(t *testing.T, step string, byCompleter bool) {
	provider := startProc(t, "payprov", []string{payprovMain + "=1"}, "payprov listening on ", "-addr", "127.0.0.1:0")
	pc := &payprov.Client{BaseURL: provider.url}
	dir := t.TempDir()
	args := []string{"-addr", "127.0.0.1:0", "-data", dir, "-provider", provider.url, "-lease", "2s", "-complete-interval", "200ms", "-provider-timeout", "5s"}
	env := []string{"SHOPD_MAIN=1", "SHOPD_PROVIDER=", "SHOPD_PAY_SECRET=", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="}
	first := startProc(t, "shopd", append(env, "SHOPD_CRASH_AFTER_STEP="+step), "shopd listening on ", args...)

	// An order, paid by a signed callback (its trade is the payment the
	// provider refunds).
	status, body, err := post(t, first.url+"/orders", "order-1", `{"sku":"BOOK-1","quantity":2}`, nil)
	if err != nil || status != http.StatusCreated {
		t.Fatalf("order: %d %s %v", status, body, err)
	}
	var o shop.Order
	if err := json.Unmarshal(body, &o); err != nil {
		t.Fatal(err)
	}
	const trade = "trade-kill-1"
	cb, _ := json.Marshal(map[string]any{"order_no": o.OrderNo, "trade_no": trade, "amount_cents": o.AmountCents, "status": shop.PaymentSuccess})
	status, body, err = post(t, first.url+"/payments/callback", "", string(cb), map[string]string{shop.PaySignatureHeader: shop.SignPayment(shop.DevPaySecret, time.Now(), cb)})
	if err != nil || status != http.StatusOK {
		t.Fatalf("payment callback: %d %s %v", status, body, err)
	}

	// The refund: shopd kills itself after step.
	refunds := first.url + "/orders/" + o.OrderNo + "/refunds"
	if status, body, err := post(t, refunds, "refund-1", "", nil); err == nil {
		t.Fatalf("the refund was answered (%d %s); shopd should have died after step %s", status, body, step)
	}
	<-first.exited
	var exit *exec.ExitError
	if !errors.As(first.err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("shopd ended with %v, want SIGKILL", first.err)
	}
	if !bytes.Contains(must(os.ReadFile(first.stderr)), []byte("killing myself after step "+step+"\n")) {
		t.Fatalf("shopd died, but not by its crash hook after %s", step)
	}

	second := startProc(t, "shopd-2", env, "shopd listening on ", args...)
	refunds = second.url + "/orders/" + o.OrderNo + "/refunds"
	deadline := time.Now().Add(60 * time.Second)
	if byCompleter {
		// Nobody retries: the completer takes the refund up once its
		// lease and backoff passed.
		for {
			req, _ := http.NewRequest(http.MethodGet, second.url+"/orders/"+o.OrderNo, nil)
			req.Header.Set("X-User-ID", "1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var got shop.Order
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if got.Status == shop.StatusRefunded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the completer did not finish the refund: order %+v", got)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The client's retry: 409 PROCESSING until the dead execution's lease
	// ends, then the refund, resumed (or, after the completer, replayed).
	var ref shop.Refund
	for {
		status, body, err := post(t, refunds, "refund-1", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if status == http.StatusCreated {
			if err := json.Unmarshal(body, &ref); err != nil {
				t.Fatal(err)
			}
			break
		}
		if status != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("retry: %d %s", status, body)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// One refund at the provider, of the trade, under one key.
	l, err := pc.Ledger(context.Background(), payprov.KindRefund)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Effects) != 1 {
		t.Fatalf("the provider made %d refunds, want 1: %+v", len(l.Effects), l.Effects)
	}
	var made payprov.Refund
	if err := json.Unmarshal(l.Effects[0].Object, &made); err != nil {
		t.Fatal(err)
	}
	if made.Payment != trade || made.AmountCents != o.AmountCents || ref.ProviderRefundID != made.ID || ref.Status != shop.StatusRefunded {
		t.Fatalf("the provider's refund %+v, the shop's answer %+v", made, ref)
	}

	second.stop(t)
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var orderStatus, rowStatus, providerID string
	var rows, events int
	for _, q := range []struct {
		query string
		dest  []any
	}{
		{`SELECT status FROM shop_orders WHERE order_no = '` + o.OrderNo + `'`, []any{&orderStatus}},
		{`SELECT COUNT(*), MAX(status), MAX(provider_refund_id) FROM shop_refunds WHERE order_no = '` + o.OrderNo + `'`, []any{&rows, &rowStatus, &providerID}},
		{`SELECT COUNT(*) FROM idem_outbox WHERE topic = 'order.refunded' AND msg_key = '` + o.OrderNo + `'`, []any{&events}},
	} {
		if err := db.QueryRow(q.query).Scan(q.dest...); err != nil {
			t.Fatalf("%s: %v", q.query, err)
		}
	}
	if got := fmt.Sprint(orderStatus, rows, rowStatus, providerID == made.ID, events); got != fmt.Sprint(shop.StatusRefunded, 1, shop.StatusRefunded, true, 1) {
		t.Fatalf("order %s, %d refund rows (%s, provider id %q; the provider's %q), %d order.refunded events; want REFUNDED, 1 REFUNDED row of the provider's refund, 1 event",
			orderStatus, rows, rowStatus, providerID, made.ID, events)
	}
	if bytes.Contains(must(os.ReadFile(second.stderr)), []byte("level=ERROR")) {
		t.Errorf("the restarted shopd logged errors")
	}
}

// must returns b, or nil when err is set (a missing log reads empty).
func must(b []byte, err error) []byte {
	if err != nil {
		return nil
	}
	return b
}
