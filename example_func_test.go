package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// ErrOutOfStock is a definite outcome: stored, and answered to every
// retry of the same reservation.
var ErrOutOfStock = &idem.DefiniteError{Code: "out_of_stock"}

type Reservation struct {
	RequestID string
	SKU       string
	Qty       int
}

// A job or consumer that is not an HTTP handler: reserve stock once per
// request ID, however often the job is retried.
func ExampleWrap() {
	g, err := idem.NewGuard(memstore.New(nil), nil)
	if err != nil {
		panic(err)
	}
	stock := map[string]int{"tea": 3}
	reserve, err := idem.Wrap(g, func(ctx context.Context, r Reservation) (int, error) {
		if stock[r.SKU] < r.Qty {
			return 0, fmt.Errorf("%s: %w", r.SKU, ErrOutOfStock)
		}
		stock[r.SKU] -= r.Qty
		return stock[r.SKU], nil
	}, &idem.FuncConfig[Reservation, int]{
		Key: func(r Reservation) (scope, key string, err error) { return "reservations", r.RequestID, nil },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	left, replayed, err := reserve.Call(ctx, Reservation{RequestID: "r1", SKU: "tea", Qty: 2})
	fmt.Println(left, replayed, err)
	left, replayed, err = reserve.Call(ctx, Reservation{RequestID: "r1", SKU: "tea", Qty: 2}) // a retry
	fmt.Println(left, replayed, err)
	_, _, err = reserve.Call(ctx, Reservation{RequestID: "r2", SKU: "tea", Qty: 2})
	fmt.Println(errors.Is(err, ErrOutOfStock), err)
	_, replayed, err = reserve.Call(ctx, Reservation{RequestID: "r2", SKU: "tea", Qty: 2}) // a retry
	fmt.Println(errors.Is(err, ErrOutOfStock), replayed)
	fmt.Println("tea left:", stock["tea"])
	// Output:
	// 1 false <nil>
	// 1 true <nil>
	// true tea: idem: definite outcome out_of_stock
	// true true
	// tea left: 1
}
