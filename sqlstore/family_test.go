package sqlstore_test

import (
	"testing"

	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/sqldialect"
	"github.com/idemkit/idem/sqlstore"
)

// A store's dialect names its SQL family, and fsm takes it as it is: one
// value configures both.
func TestDialectFamily(t *testing.T) {
	t.Parallel()
	m := fsm.MustNew(&fsm.Definition{
		States:      []fsm.State{"NEW", "DONE"},
		Initial:     "NEW",
		Final:       []fsm.State{"DONE"},
		Transitions: []fsm.Transition{{Name: "finish", From: []fsm.State{"NEW"}, To: "DONE"}},
	})
	for d, want := range map[sqlstore.Dialect]sqldialect.Family{
		sqlstore.PostgreSQL: sqldialect.PostgreSQL,
		sqlstore.MySQL:      sqldialect.MySQL,
		sqlstore.SQLite:     sqldialect.SQLite,
	} {
		if got := d.Family(); got != want {
			t.Errorf("%v.Family() = %v, want %v", d, got, want)
		}
		if _, err := fsm.NewTable(m, &fsm.TableConfig{Dialect: d, Table: "orders"}); err != nil {
			t.Errorf("fsm.NewTable(%v): %v", d, err)
		}
	}
}
