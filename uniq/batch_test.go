package uniq

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/sqldialect"
)

// noQuerier fails the test on any statement: InsertBatch must refuse bad
// input before it writes (the database tests are in the cmd module).
type noQuerier struct{ t *testing.T }

func (n noQuerier) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	n.t.Fatal("a statement ran")
	return nil, nil
}

func (n noQuerier) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	n.t.Fatal("a statement ran")
	return nil, nil
}

func (n noQuerier) QueryRowContext(context.Context, string, ...any) *sql.Row {
	n.t.Fatal("a statement ran")
	return nil
}

func TestInsertBatchRefuses(t *testing.T) {
	t.Parallel()
	good := BatchSpec{Dialect: sqldialect.PostgreSQL, Table: "shop.products", Columns: []string{"sku", "name"}, Key: "sku"}
	row := []any{"a", "A"}
	for _, tc := range []struct {
		name string
		spec func(*BatchSpec)
		rows [][]any
		opts []Option
		want string
	}{
		{name: "no dialect", spec: func(s *BatchSpec) { s.Dialect = nil }, want: "Dialect is required"},
		{name: "unknown dialect", spec: func(s *BatchSpec) { s.Dialect = sqldialect.Family(9) }, want: "unknown SQL family"},
		{name: "no table", spec: func(s *BatchSpec) { s.Table = "" }, want: "Table is required"},
		{name: "bad table", spec: func(s *BatchSpec) { s.Table = "a.b.c" }, want: "at most one '.'"},
		{name: "quoted table", spec: func(s *BatchSpec) { s.Table = `"x"` }, want: "not a plain identifier"},
		{name: "no key", spec: func(s *BatchSpec) { s.Key = "" }, want: "Key is required"},
		{name: "key not a column", spec: func(s *BatchSpec) { s.Key = "ean" }, want: `Key "ean" is not among Columns`},
		{name: "no columns", spec: func(s *BatchSpec) { s.Columns = nil }, want: "Columns is required"},
		{name: "column twice", spec: func(s *BatchSpec) { s.Columns = []string{"sku", "name", "SKU"} }, want: `"SKU" appears twice`},
		{name: "bad column", spec: func(s *BatchSpec) { s.Columns = []string{"sku", "name; DROP"} }, want: "Columns[1]"},
		{name: "negative size", spec: func(s *BatchSpec) { s.Size = -1 }, want: "Size -1"},
		{name: "short row", rows: [][]any{row, {"b"}}, want: "rows[1] has 1 values for 2 columns"},
		{name: "long row", rows: [][]any{{"b", "B", 3}}, want: "rows[0] has 3 values for 2 columns"},
		{name: "nil key", rows: [][]any{row, {nil, "B"}}, want: "rows[1]: key sku: is NULL"},
		{name: "unconvertible key", rows: [][]any{{struct{}{}, "B"}}, want: "rows[0]: key sku"},
		{name: "attempts", rows: [][]any{row}, opts: []Option{Attempts(0)}, want: "Attempts(0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := good
			if tc.spec != nil {
				tc.spec(&spec)
			}
			rows := tc.rows
			if rows == nil {
				rows = [][]any{row}
			}
			got, err := InsertBatch(context.Background(), noQuerier{t}, spec, rows, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if got != nil {
				t.Errorf("outcomes %v with an error before any statement", got)
			}
		})
	}
}

// TestInsertBatchEmpty: no rows, no statement.
func TestInsertBatchEmpty(t *testing.T) {
	spec := BatchSpec{Dialect: sqldialect.SQLite, Table: "t", Columns: []string{"k"}, Key: "k"}
	got, err := InsertBatch(context.Background(), noQuerier{t}, spec, nil)
	if err != nil || len(got) != 0 {
		t.Fatalf("%v, %v", got, err)
	}
}

// TestBatchSize: Size defaults to DefaultBatchSize and is lowered to fit
// each database's limit of bound parameters.
func TestBatchSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f          sqldialect.Family
		size, cols int
		want       int
	}{
		{sqldialect.PostgreSQL, 0, 3, DefaultBatchSize},
		{sqldialect.PostgreSQL, 100000, 3, 21845},
		{sqldialect.MySQL, 100000, 4, 16383},
		{sqldialect.SQLite, 100000, 3, 10922},
		{sqldialect.SQLite, 100000, 40000, 1},
		{sqldialect.SQLite, 7, 2, 7},
	} {
		cols := make([]string, tc.cols)
		for i := range cols {
			cols[i] = "c" + strconv.Itoa(i)
		}
		b, err := newBatch(BatchSpec{Dialect: tc.f, Table: "t", Columns: cols, Key: cols[0], Size: tc.size})
		if err != nil {
			t.Fatal(err)
		}
		if b.size != tc.want || b.size*tc.cols > max(tc.cols, map[sqldialect.Family]int{sqldialect.PostgreSQL: 65535, sqldialect.MySQL: 65535, sqldialect.SQLite: 32766}[tc.f]) {
			t.Errorf("%v, Size %d, %d columns: %d rows per statement, want %d", tc.f, tc.size, tc.cols, b.size, tc.want)
		}
	}
}

// TestKeyString: keys compare as database/sql scans them into a string.
func TestKeyString(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 12, 2, 10, 0, 0, 5, time.UTC)
	for v, want := range map[any]string{
		"a": "a", int64(-5): "-5", 7: "7", uint8(3): "3", true: "true", 1.5: "1.5", ts: "2026-12-02T10:00:00.000000005Z",
	} {
		got, err := keyString(v)
		if err != nil || got != want {
			t.Errorf("keyString(%#v) = %q, %v; want %q", v, got, err, want)
		}
		var scanned string
		if err := convert(&scanned, v); err != nil || scanned != want {
			t.Errorf("database/sql scans %#v as %q, %v; keyString says %q", v, scanned, err, want)
		}
	}
	if got, _ := keyString([]byte("raw")); got != "raw" {
		t.Errorf("keyString([]byte) = %q", got)
	}
}

// convert scans v into dst as database/sql scans a driver's value into a
// *string: sql.Null's Scan uses the same conversion.
func convert(dst *string, v any) error {
	var n sql.Null[string]
	dv, err := driver.DefaultParameterConverter.ConvertValue(v)
	if err != nil {
		return err
	}
	if err := n.Scan(dv); err != nil {
		return err
	}
	*dst = n.V
	return nil
}
