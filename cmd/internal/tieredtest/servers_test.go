package tieredtest_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/storetest"
)

// TestConformanceServers runs the conformance suite on a tiered store
// over sqlstore on PostgreSQL (whose renewals live in idem_renewals and
// whose reads go through idem_records_renewed) and on MariaDB: the cache
// must agree with each truth, field for field.
func TestConformanceServers(t *testing.T) {
	for _, tc := range []struct {
		dialect sqlstore.Dialect
		fresh   func(testing.TB) (*sql.DB, string)
	}{
		{sqlstore.PostgreSQL, testdb.Postgres},
		{sqlstore.MySQL, testdb.MySQL},
	} {
		t.Run(tc.dialect.String(), func(t *testing.T) {
			t.Parallel()
			// A database of its own: other test processes sweep idem's
			// tables in the shared one, and the suite reads expired
			// records.
			db, _ := tc.fresh(t)
			truth, err := sqlstore.New(db, &sqlstore.Config{Dialect: tc.dialect})
			if err != nil {
				t.Fatal(err)
			}
			if err := truth.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			c := redisClient(t)
			s := newTiered(t, c, c, truth, nil)
			storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{
				BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
				Precision: time.Millisecond,
			})
		})
	}
}
