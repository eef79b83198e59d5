package fsm

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/idemkit/idem/sqldialect"
)

func TestNewTableRefuses(t *testing.T) {
	t.Parallel()
	m := MustNew(orderDef())
	if _, err := NewTable(nil, &TableConfig{Dialect: sqldialect.SQLite, Table: "orders"}); err == nil {
		t.Error("nil machine accepted")
	}
	if _, err := NewTable(m, nil); err == nil {
		t.Error("nil config accepted")
	}
	for _, tc := range []struct {
		cfg  TableConfig
		want string
	}{
		{TableConfig{Table: "orders"}, "Dialect is required"},
		{TableConfig{Dialect: sqldialect.Family(9), Table: "orders"}, "unknown SQL family"},
		{TableConfig{Dialect: otherDialect{}, Table: "orders"}, "unknown SQL family"},
		{TableConfig{Dialect: sqldialect.SQLite}, "Table is required"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "orders; DROP TABLE orders"}, "not a plain identifier"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: `"orders"`}, "not a plain identifier"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "a.b.c"}, "at most one '.'"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "shop."}, "not a plain identifier"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "1orders"}, "not a plain identifier"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: strings.Repeat("t", 64)}, "not a plain identifier"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "orders", ID: "id = id OR 1=1 --"}, "TableConfig.ID"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "orders", Status: "st-atus"}, "TableConfig.Status"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "orders", Version: "v ersion"}, "TableConfig.Version"},
		{TableConfig{Dialect: sqldialect.SQLite, Table: "orders", Version: "ID"}, "two roles"},
	} {
		if _, err := NewTable(m, &tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want one saying %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := NewTable(m, &TableConfig{Dialect: sqldialect.PostgreSQL, Table: "shop.orders_2", ID: "_ref", Status: "State", Version: "rev"}); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

// The statements each dialect builds, with their arguments.
func TestUpdateText(t *testing.T) {
	t.Parallel()
	m := MustNew(orderDef())
	for _, tc := range []struct {
		dialect sqldialect.Family
		cfg     TableConfig
		to      State
		sources []State
		opts    []Option
		query   string
		args    []any
	}{
		{sqldialect.PostgreSQL, TableConfig{}, "PAID", []State{"WAIT_PAY"}, nil,
			`UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status::text COLLATE "C" = $3 RETURNING version`,
			[]any{"PAID", 7, "WAIT_PAY"}},
		{sqldialect.PostgreSQL, TableConfig{}, "CANCELLED", []State{"NEW", "WAIT_PAY"}, []Option{IfVersion(3), Set("reason", "late"), SetNow("cancelled_at")},
			`UPDATE orders SET status = $1, version = version + 1, reason = $2, cancelled_at = now() WHERE id = $3 AND status::text COLLATE "C" IN ($4, $5) AND version = $6 RETURNING version`,
			[]any{"CANCELLED", "late", 7, "NEW", "WAIT_PAY", int64(3)}},
		{sqldialect.MySQL, TableConfig{}, "CANCELLED", []State{"NEW", "WAIT_PAY"}, []Option{IfVersion(3), SetNow("cancelled_at")},
			"UPDATE orders SET status = ?, version = LAST_INSERT_ID(version + 1), cancelled_at = CURRENT_TIMESTAMP(6) WHERE id = ? AND CAST(CONVERT(status USING utf8mb4) AS BINARY) IN (?, ?) AND version = ?",
			[]any{"CANCELLED", 7, "NEW", "WAIT_PAY", int64(3)}},
		{sqldialect.SQLite, TableConfig{ID: "ref", Status: "state", Version: "rev", Table: "shop.orders"}, "PAID", []State{"WAIT_PAY"}, []Option{Set("paid_at", 99)},
			"UPDATE shop.orders SET state = ?, rev = rev + 1, paid_at = ? WHERE ref = ? AND state COLLATE BINARY = ? RETURNING rev",
			[]any{"PAID", 99, 7, "WAIT_PAY"}},
		{sqldialect.SQLite, TableConfig{}, "PAID", []State{"WAIT_PAY"}, []Option{SetNow("paid_at")},
			"UPDATE orders SET status = ?, version = version + 1, paid_at = strftime('%Y-%m-%d %H:%M:%f', 'now') WHERE id = ? AND status COLLATE BINARY = ? RETURNING version",
			[]any{"PAID", 7, "WAIT_PAY"}},
	} {
		cfg := tc.cfg
		cfg.Dialect = tc.dialect
		if cfg.Table == "" {
			cfg.Table = "orders"
		}
		tb, err := NewTable(m, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		var c call
		for _, o := range tc.opts {
			o(&c)
		}
		query, args, err := tb.update(tc.to, tc.sources, &c, 7)
		if err != nil {
			t.Fatal(err)
		}
		if query != tc.query || !reflect.DeepEqual(args, tc.args) {
			t.Errorf("%v:\n got %s %v\nwant %s %v", tc.dialect, query, args, tc.query, tc.args)
		}
	}
	mysqlTable, _ := NewTable(m, &TableConfig{Dialect: sqldialect.MySQL, Table: "orders"})
	if want := "SELECT status, version FROM orders WHERE id = ? LOCK IN SHARE MODE"; mysqlTable.selectQuery != want {
		t.Errorf("MySQL read: %s, want %s", mysqlTable.selectQuery, want)
	}
	pgTable, _ := NewTable(m, &TableConfig{Dialect: sqldialect.PostgreSQL, Table: "orders"})
	if want := "SELECT status::text, version FROM orders WHERE id = $1"; pgTable.selectQuery != want {
		t.Errorf("PostgreSQL read: %s, want %s", pgTable.selectQuery, want)
	}
}

// Calls refused before any statement: the Querier is nil and never used.
func TestTransitionRefusedEarly(t *testing.T) {
	t.Parallel()
	tb, err := NewTable(MustNew(orderDef()), &TableConfig{Dialect: sqldialect.PostgreSQL, Table: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ie *IllegalTransitionError
	for _, tc := range []struct {
		name    string
		call    func() (Result, error)
		is      error
		illegal *IllegalTransitionError
		text    string
	}{
		{"unknown state", func() (Result, error) { return tb.Transition(ctx, nil, 1, "LOST") }, ErrUnknownState, nil, `"LOST"`},
		{"unknown transition", func() (Result, error) { return tb.Fire(ctx, nil, 1, "refund") }, ErrUnknownTransition, nil, `"refund"`},
		{"to the initial state", func() (Result, error) { return tb.Transition(ctx, nil, 1, "NEW") }, ErrIllegal,
			&IllegalTransitionError{ID: 1, Target: "NEW"}, "no transition leads there (the row's state was not read)"},
		{"Set of the status", func() (Result, error) { return tb.Transition(ctx, nil, 1, "PAID", Set("STATUS", "x")) }, nil, nil, "status or version"},
		{"Set of a bad column", func() (Result, error) { return tb.Transition(ctx, nil, 1, "PAID", Set("a=1,b", "x")) }, nil, nil, "plain identifier"},
		{"Set twice", func() (Result, error) {
			return tb.Transition(ctx, nil, 1, "PAID", Set("paid_at", 1), SetNow("Paid_At"))
		}, nil, nil, "set twice"},
	} {
		res, err := tc.call()
		if err == nil || res != (Result{}) {
			t.Errorf("%s: %+v, %v; want an error", tc.name, res, err)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: %v is not %v", tc.name, err, tc.is)
		}
		if !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v does not say %q", tc.name, err, tc.text)
		}
		if tc.illegal != nil && (!errors.As(err, &ie) || !reflect.DeepEqual(ie, tc.illegal)) {
			t.Errorf("%s: %#v, want %#v", tc.name, err, tc.illegal)
		}
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	c := &ConflictError{ID: 4, Current: "WAIT_PAY", Version: 5, Target: "PAID", Expected: 3, HasExpected: true}
	if !errors.Is(c, ErrConflict) || errors.Is(c, ErrIllegal) || !strings.Contains(c.Error(), "expected version 3") {
		t.Errorf("ConflictError: %v", c)
	}
	i := &IllegalTransitionError{ID: 4, Current: "PAID", CurrentKnown: true, Target: "CANCELLED", Allowed: []State{"NEW", "WAIT_PAY"}}
	if !errors.Is(i, ErrIllegal) || errors.Is(i, ErrConflict) ||
		i.Error() != `fsm: illegal transition of 4: it is in "PAID", and "CANCELLED" is allowed only from "NEW", "WAIT_PAY"` {
		t.Errorf("IllegalTransitionError: %v", i)
	}
}

// otherDialect is a store's dialect that names no family fsm knows.
type otherDialect struct{}

func (otherDialect) Family() sqldialect.Family { return 0 }
