package steps_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/steps"
)

// A checkout charges a card, then books a shipment: two foreign calls,
// each with a key derived from the checkout's. The carrier fails once;
// the retry resumes after the charge, which is not made again.
func ExampleDefine() {
	store := memstore.New(nil)
	g, _ := idem.NewGuard(store, nil)
	journal, _ := steps.NewMemory(store)
	runner, _ := steps.New(g, journal, nil)

	charges, carrierDown := 0, true
	checkout, err := steps.Define(runner, "checkout", func(ctx context.Context, s *steps.Run, order string) (string, error) {
		charge, err := steps.Foreign(s, "charge", func(ctx context.Context, key string) (string, error) {
			charges++ // a payment provider de-duplicates by key
			return "ch_1", nil
		})
		if err != nil {
			return "", err
		}
		ship, err := steps.Foreign(s, "ship", func(ctx context.Context, key string) (string, error) {
			if carrierDown {
				carrierDown = false
				return "", errors.New("carrier unavailable")
			}
			return "shp_1", nil
		})
		if err != nil {
			return "", err
		}
		return order + " paid by " + charge + ", shipped as " + ship, nil
	}, &steps.OpConfig[string, string]{
		Key: func(order string) (string, string, error) { return "", "checkout-" + order, nil },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	_, _, err = checkout.Call(ctx, "order-7")
	fmt.Println("first:", err)
	out, _, err := checkout.Call(ctx, "order-7")
	fmt.Println("retry:", out, err)
	out, replayed, _ := checkout.Call(ctx, "order-7")
	fmt.Println("again:", out, "replayed:", replayed, "charges:", charges)
	// Output:
	// first: carrier unavailable
	// retry: order-7 paid by ch_1, shipped as shp_1 <nil>
	// again: order-7 paid by ch_1, shipped as shp_1 replayed: true charges: 1
}
