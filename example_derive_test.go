package idem_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

func ExampleDeriveKey() {
	parent := "8e03978e-40d5-43e8" // the Idempotency-Key of the request being handled
	fmt.Println(idem.DeriveKey(parent, "charge"))
	fmt.Println(idem.DeriveKey(parent, "charge") == idem.DeriveKey(parent, "charge"))
	fmt.Println(idem.DeriveKey(parent, "charge") == idem.DeriveKey(parent, "refund"))
	// Output:
	// d1_i8ROl9T7XW6QiPEspLsbbGbd_aYrLKaRVxgAjyi5gNk
	// true
	// false
}

// provider is a payment provider that de-duplicates charges by the
// Idempotency-Key of its API, as real providers do.
type provider struct{ charges map[string]int }

func (p *provider) charge(key string, cents int) {
	if _, seen := p.charges[key]; !seen {
		p.charges[key] = cents
	}
}

// An order handler charges the provider, then fails before it answers (a
// crash, a lost database connection): the record is released and the
// client's retry runs the handler again. The retry derives the same key
// from the lease, so the provider charges once. The lease's scope is part
// of the derivation: two users who send the same Idempotency-Key make two
// charges.
func ExampleLease_DeriveKey() {
	psp := &provider{charges: map[string]int{}}
	mw, err := idemhttp.New(&idemhttp.Config{
		Store: memstore.New(nil),
		Scope: func(r *http.Request) (string, error) { return "user:" + r.Header.Get("X-User-ID"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	failOnce := true
	orders := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lease := idemhttp.ExecutionFrom(r.Context()).Lease()
		psp.charge(lease.DeriveKey("charge"), 2500)
		if failOnce {
			failOnce = false
			http.Error(w, "database went away", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))

	for _, user := range []string{"7", "7", "8"} {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"BOOK-1"}`))
		r.Header.Set("X-User-ID", user)
		r.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		orders.ServeHTTP(w, r)
		fmt.Println("user", user, w.Code)
	}
	fmt.Println("charges:", len(psp.charges))
	// Output:
	// user 7 500
	// user 7 201
	// user 8 201
	// charges: 2
}
