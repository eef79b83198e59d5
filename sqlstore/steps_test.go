package sqlstore_test

import (
	"testing"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/steps/stepstest"
)

// TestStepJournal runs package steps' suite on each dialect: the
// journal next to the records of a Store on the same database.
func TestStepJournal(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := srv.setup(t)
		j, err := sqlstore.NewStepJournal(db, &sqlstore.Config{Dialect: srv.dialect})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = j.Close() })
		bind := func(int) string { return "?" }
		if srv.dialect == sqlstore.PostgreSQL {
			bind = func(i int) string { return "$" + string(rune('0'+i)) }
		}
		stepstest.Run(t, func(t *testing.T) stepstest.Setup {
			return stepstest.Setup{Store: s, Journal: j, DB: db, Bind: bind}
		})
	})
}
