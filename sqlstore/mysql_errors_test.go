package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/internal/testenv"
)

// TestMySQLErrorClassification: the MySQL dialect classifies the driver's
// *mysql.MySQLError wherever it sits in the error's tree (wrapped, or
// joined with another error), here one the server returned, and never an
// error that merely reads like one.
func TestMySQLErrorClassification(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", testenv.MySQL.Need(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, testenv.MySQL.Name, testenv.MySQL.Var, err)
	}
	_, missing := db.ExecContext(ctx, "SELECT 1 FROM idem_no_such_table_8f3a")
	var myErr *mysql.MySQLError
	if !errors.As(missing, &myErr) || myErr.Number != 1146 {
		t.Fatalf("selecting from a missing table: %v; want the server's error 1146", missing)
	}
	for name, err := range map[string]error{
		"as returned": missing,
		"wrapped":     fmt.Errorf("a: %w", fmt.Errorf("b: %w", missing)),
		"joined":      errors.Join(context.DeadlineExceeded, missing),
		"joined late": fmt.Errorf("a: %w", errors.Join(errors.New("x"), fmt.Errorf("b: %w", missing))),
	} {
		if !MySQL.missingTable(err) {
			t.Errorf("missingTable(%s: %v) = false", name, err)
		}
		if MySQL.retryable(err) {
			t.Errorf("retryable(%s: %v) = true", name, err)
		}
	}

	deadlock := &mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'}, Message: "Deadlock found when trying to get lock; try restarting transaction"}
	if !MySQL.retryable(fmt.Errorf("a: %w", deadlock)) || !MySQL.retryable(errors.Join(errors.New("x"), deadlock)) || MySQL.missingTable(deadlock) {
		t.Error("a wrapped or joined deadlock is not retryable")
	}
	// Text is not an error number: neither a look-alike message nor
	// another error type's text counts.
	for _, err := range []error{
		errors.New(deadlock.Error()),
		errors.New(missing.Error()),
		&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded; Error 1213"},
		errors.New("deadlock"),
		nil,
	} {
		if MySQL.retryable(err) || MySQL.missingTable(err) {
			t.Errorf("%v is classified as a server error it is not", err)
		}
	}
}
