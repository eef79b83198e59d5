package sqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/storetest"
)

func TestConformance(t *testing.T) {
	db, s := setup(t)
	storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{
		BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Precision: time.Millisecond,
	})
}
