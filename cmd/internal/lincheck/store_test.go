package lincheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/lincheck"
	"github.com/idemkit/idem/memstore"
)

// checkStore runs the workload on store and checks its history.
func checkStore(t *testing.T, store idem.Store, cfg lincheck.StoreModelConfig, w lincheck.StoreWorkload) lincheck.StoreStats {
	t.Helper()
	if cfg.Margin == 0 {
		cfg.Margin = int64(5 * time.Millisecond)
	}
	h, stats := lincheck.RunStore(context.Background(), store, w)
	t.Logf("%v", stats)
	h.Check(t, lincheck.StoreModel(cfg))
	return stats
}

func TestMemstore(t *testing.T) {
	stats := checkStore(t, memstore.New(nil), lincheck.StoreModelConfig{}, lincheck.StoreWorkload{Sweep: true})
	if stats.TookOver == 0 || stats.Replayed == 0 || stats.InFlight == 0 || stats.Mismatch == 0 || stats.LeaseLost == 0 {
		t.Errorf("the workload missed a path of the contract: %v", stats)
	}
}
