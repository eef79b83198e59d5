package shop_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// With OTEL_EXPORTER_OTLP_ENDPOINT set, shopd exports its spans, and the
// trace of a payment callback travels with the order.paid event through
// the outbox and the embedded NATS into the loyalty consumer: the
// consumer's span (idem.inbox) is in the callback's trace.
func TestTraceFollowsTheEventToTheConsumer(t *testing.T) {
	var (
		mu    sync.Mutex
		spans []span
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Errorf("the collector got an undecodable export: %v", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					attrs := map[string]string{}
					for _, a := range s.Attributes {
						attrs[a.Key] = a.Value.GetStringValue()
					}
					spans = append(spans, span{name: s.Name, trace: hex.EncodeToString(s.TraceId), attrs: attrs})
				}
			}
		}
	}))
	// Closed after shopd (cleanups run last first), which exports its
	// last spans as it stops.
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

	base, _ := runShopd(t, "-addr", "127.0.0.1:0", "-data", filepath.Join(t.TempDir(), "data"), "-pay-secret", testPaySecret)
	const uid = "4242"
	r := do(t, "POST", base+"/orders", uid, "trace-order", `{"sku":"SKU-1","quantity":1}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create order: %d %s", r.status, r.body)
	}
	var o shop.Order
	if err := json.Unmarshal([]byte(r.body), &o); err != nil {
		t.Fatal(err)
	}
	body := []byte(fmt.Sprintf(`{"order_no":%q,"trade_no":"T-%s","amount_cents":%d,"status":"SUCCESS"}`, o.OrderNo, o.OrderNo, o.AmountCents))
	req, _ := http.NewRequest("POST", base+"/payments/callback", bytes.NewReader(body))
	req.Header.Set(shop.PaySignatureHeader, shop.SignPayment(testPaySecret, time.Now(), body))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("callback: %d", resp.StatusCode)
	}
	pollPoints(t, base, uid, func(p shop.Points) bool { return len(p.Ledger) > 0 })

	// The callback's request span (its idem.request, route "POST
	// /payments/callback") and the consumer's idem.inbox span of group
	// shop-loyalty must share a trace.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		var callback, consumer []string
		for _, s := range spans {
			if s.attrs["idem.route"] == "POST /payments/callback" && s.attrs["idem.kind"] == "request" {
				callback = append(callback, s.trace)
			}
			if s.attrs["idem.kind"] == "inbox" && s.attrs["idem.route"] == shop.LoyaltyGroup && s.attrs["idem.outcome"] == "processed" {
				consumer = append(consumer, s.trace)
			}
		}
		n := len(spans)
		mu.Unlock()
		if len(callback) > 0 && len(consumer) > 0 {
			for _, c := range consumer {
				if c == callback[0] {
					return
				}
			}
			t.Fatalf("the consumer's spans are in traces %v, the callback's in %v: the trace did not travel with the event", consumer, callback)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s, %d spans exported: callback traces %v, consumer traces %v", n, callback, consumer)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type span struct {
	name, trace string
	attrs       map[string]string
}
