package steps_test

import (
	"testing"

	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/steps/stepstest"
)

func TestMemory(t *testing.T) {
	stepstest.Run(t, func(t *testing.T) stepstest.Setup {
		st := memstore.New(nil)
		j, err := steps.NewMemory(st)
		if err != nil {
			t.Fatal(err)
		}
		return stepstest.Setup{Store: st, Journal: j}
	})
}
