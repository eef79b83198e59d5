package uniq

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
)

// pgLike has the SQLState method of pgx's and lib/pq's errors.
type pgLike struct{ code string }

func (e *pgLike) Error() string    { return "pg " + e.code }
func (e *pgLike) SQLState() string { return e.code }

// Stand-ins for the drivers recognised by type (their package path is this
// package's, so the test registers them in drivers for its run).
type (
	MySQLError struct {
		Number   uint16
		SQLState [5]byte
	}
	SQLiteError   struct{ code int }
	Mattn         struct{ ExtendedCode int }
	OldPQ         struct{ Code pqCode }
	pqCode        string
	valueReceiver struct{ Number uint16 }
)

func (e *MySQLError) Error() string   { return fmt.Sprint("mysql ", e.Number) }
func (e *SQLiteError) Error() string  { return fmt.Sprint("sqlite ", e.code) }
func (e *SQLiteError) Code() int      { return e.code }
func (e Mattn) Error() string         { return fmt.Sprint("mattn ", e.ExtendedCode) }
func (e *OldPQ) Error() string        { return "pq " + string(e.Code) }
func (e valueReceiver) Error() string { return "value" }

func TestIsDuplicate(t *testing.T) {
	const pkg = "github.com/idemkit/idem/uniq"
	saved := drivers
	// The real entries' functions, keyed to the stand-ins' names.
	drivers = []driverError{
		{pkg, "MySQLError", saved[0].dup},
		{pkg, "SQLiteError", saved[1].dup},
		{pkg, "Mattn", saved[2].dup},
		{pkg, "OldPQ", saved[3].dup},
		{pkg, "valueReceiver", saved[0].dup},
	}
	t.Cleanup(func() { drivers = saved })
	if reflect.TypeOf(MySQLError{}).PkgPath() != pkg {
		t.Fatalf("stand-ins' package path is %q", reflect.TypeOf(MySQLError{}).PkgPath())
	}

	var (
		nilMySQL  *MySQLError
		nilPG     *pgLike // its SQLState reads a field, as pgconn's does
		nilSQLite *SQLiteError
	)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("duplicate key value violates unique constraint"), false},
		{"EOF", io.EOF, false},
		{"pg unique", &pgLike{"23505"}, true},
		{"pg foreign key", &pgLike{"23503"}, false},
		{"pg not null", &pgLike{"23502"}, false},
		{"pg check", &pgLike{"23514"}, false},
		{"pg exclusion", &pgLike{"23P01"}, false},
		{"pg wrapped", fmt.Errorf("insert: %w", &pgLike{"23505"}), true},
		{"pg wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", &pgLike{"23505"})), true},
		{"joined", errors.Join(io.EOF, &pgLike{"23505"}), true},
		{"joined, no duplicate", errors.Join(io.EOF, &pgLike{"23503"}), false},
		{"errorf with two", fmt.Errorf("%w %w", io.EOF, &MySQLError{Number: 1062}), true},
		{"mysql 1062", &MySQLError{Number: 1062}, true},
		{"mysql 1586", &MySQLError{Number: 1586}, true},
		{"mysql foreign key 1452", &MySQLError{Number: 1452}, false},
		{"mysql not null 1048", &MySQLError{Number: 1048}, false},
		{"mysql check 4025", &MySQLError{Number: 4025}, false},
		{"mysql nil pointer", nilMySQL, false},
		{"pg nil pointer", nilPG, false},
		{"pg nil pointer, wrapped", fmt.Errorf("x: %w", nilPG), false},
		{"sqlite nil pointer", nilSQLite, false},
		{"sqlite unique", &SQLiteError{2067}, true},
		{"sqlite primary key", &SQLiteError{1555}, true},
		{"sqlite rowid", &SQLiteError{2579}, true},
		{"sqlite constraint", &SQLiteError{19}, false},
		{"sqlite foreign key", &SQLiteError{787}, false},
		{"sqlite not null", &SQLiteError{1299}, false},
		{"sqlite check", &SQLiteError{275}, false},
		{"mattn unique (value type)", Mattn{2067}, true},
		{"mattn primary key", fmt.Errorf("x: %w", Mattn{1555}), true},
		{"mattn foreign key", Mattn{787}, false},
		{"old lib/pq unique", &OldPQ{"23505"}, true},
		{"old lib/pq foreign key", &OldPQ{"23503"}, false},
		{"value receiver", valueReceiver{1062}, true},
	} {
		if got := IsDuplicate(tc.err); got != tc.want {
			t.Errorf("%s: IsDuplicate(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// A type of the same name in another package is not a driver's.
func TestIsDuplicateNeedsThePackage(t *testing.T) {
	t.Parallel()
	if IsDuplicate(&MySQLError{Number: 1062}) {
		t.Error("a MySQLError of this package counts as go-sql-driver's")
	}
}
