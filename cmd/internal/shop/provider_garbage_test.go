package shop_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/cmd/internal/shop"
	"github.com/idemkit/idem/steps"
)

// garbler is a proxy in front of the provider that, while garble > 0,
// lets a POST to path through (the provider makes its effect) and
// answers its caller the provider's status with body instead of the
// provider's: a success that names no effect.
type garbler struct {
	path   string
	body   string
	garble atomic.Int32
}

func (g *garbler) start(t *testing.T, target string) string {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPost || resp.Request.URL.Path != g.path || resp.StatusCode/100 != 2 || g.garble.Add(-1) < 0 {
			return nil
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader([]byte(g.body)))
		resp.ContentLength = int64(len(g.body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(g.body)))
		return nil
	}
	ts := httptest.NewServer(p)
	t.Cleanup(ts.Close)
	return ts.URL
}

// garbleRig is a refundRig whose shop reaches the provider through g.
func garbleRig(t *testing.T, b backend, g *garbler) *refundRig {
	t.Helper()
	c, _ := newProvider(t)
	through := &payprov.Client{BaseURL: g.start(t, c.BaseURL), HTTP: &http.Client{Timeout: 5 * time.Second}}
	db, _ := b.fresh(t)
	s := shopOnWith(t, db, b.dialect, shop.DefaultCatalog(), func(cfg *shop.Config) {
		cfg.Provider = through
		cfg.Steps = &steps.Config{Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	})
	return &refundRig{s: s, db: db, provider: c}
}

// A provider (or a proxy before it) that answers a success naming no
// effect ({} or null: no id) leaves the outcome unknown, as a timeout
// does: 503, the order held, and the retry under the key gets the
// provider's stored answer. Taking the empty answer for the effect
// marked an order PAID with no payment row (a refund then went to a
// payment that does not exist, the charge never refunded), a refund
// REFUNDED with no provider refund, a shipment with no id.
func TestProviderAnswerWithoutID(t *testing.T) {
	for _, body := range []string{`{}`, `null`, `{"id":""}`} {
		t.Run("charge "+body, func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				g := &garbler{path: "/v1/charges", body: body}
				g.garble.Store(1)
				r := garbleRig(t, b, g)
				_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"SKU-1","quantity":1}`)
				rec := r.checkout(o.OrderNo, "c1", "tok_visa")
				if rec.Code != http.StatusServiceUnavailable || problemCode(t, rec) != shop.CodeProviderUnavailable {
					t.Fatalf("checkout answered %s without id: %d %s", body, rec.Code, rec.Body)
				}
				if st := r.checkoutState(t, o.OrderNo); st != (checkoutState{Order: shop.StatusCharging, Charges: 1}) {
					t.Fatalf("after an answer without id: %+v", st)
				}
				if rec := r.checkout(o.OrderNo, "c1", "tok_visa"); rec.Code != http.StatusCreated {
					t.Fatalf("retry: %d %s", rec.Code, rec.Body)
				}
				if st := r.checkoutState(t, o.OrderNo); st != checkedOut {
					t.Fatalf("after the retry: %+v, want %+v", st, checkedOut)
				}
				l, err := r.provider.Ledger(context.Background(), payprov.KindCharge)
				if err != nil {
					t.Fatal(err)
				}
				if n := countRows(t, r.db, `SELECT COUNT(*) FROM shop_payments WHERE trade_no = '`+l.Effects[0].ID+`'`); n != 1 {
					t.Fatalf("%d payment rows of the charge %s, want 1", n, l.Effects[0].ID)
				}
			})
		})
	}
	t.Run("refund", func(t *testing.T) {
		forBackends(t, func(t *testing.T, b backend) {
			g := &garbler{path: "/v1/refunds", body: `{}`}
			g.garble.Store(1)
			r := garbleRig(t, b, g)
			o := r.paidOrder(t, "o1")
			if rec := r.post(o.OrderNo, "r1"); rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("refund answered {}: %d %s", rec.Code, rec.Body)
			}
			if st := r.state(t, o.OrderNo); st != (refundState{Order: shop.StatusRefunding, Rows: 1, Row: shop.StatusRefunding, Ledger: 1}) {
				t.Fatalf("after an answer without id: %+v", st)
			}
			if rec := r.post(o.OrderNo, "r1"); rec.Code != http.StatusCreated {
				t.Fatalf("retry: %d %s", rec.Code, rec.Body)
			}
			if st := r.state(t, o.OrderNo); !done(st) {
				t.Fatalf("after the retry: %+v", st)
			}
		})
	})
	t.Run("shipment", func(t *testing.T) {
		forBackends(t, func(t *testing.T, b backend) {
			g := &garbler{path: "/v1/shipments", body: `{}`}
			g.garble.Store(1)
			r := garbleRig(t, b, g)
			_, o, _ := postOrder(t, r.s, 5, "o1", `{"sku":"SKU-1","quantity":1}`)
			if rec := r.checkout(o.OrderNo, "c1", "tok_visa"); rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("shipment answered {}: %d %s", rec.Code, rec.Body)
			}
			if n := countRows(t, r.db, `SELECT COUNT(*) FROM shop_shipments WHERE order_no = '`+o.OrderNo+`'`); n != 0 {
				t.Fatalf("%d shipment rows after an answer without id", n)
			}
			if rec := r.checkout(o.OrderNo, "c1", "tok_visa"); rec.Code != http.StatusCreated {
				t.Fatalf("retry: %d %s", rec.Code, rec.Body)
			}
			if st := r.checkoutState(t, o.OrderNo); st != checkedOut {
				t.Fatalf("after the retry: %+v, want %+v", st, checkedOut)
			}
			if n := countRows(t, r.db, `SELECT COUNT(*) FROM shop_shipments WHERE order_no = '`+o.OrderNo+`' AND shipment_id LIKE 'shp_%'`); n != 1 {
				t.Fatalf("%d shipment rows with the carrier's id, want 1", n)
			}
		})
	})
}
