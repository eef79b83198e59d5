package sqlstore_test

import (
	"testing"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/lock/locktest"
	"github.com/idemkit/idem/sqlstore"
)

// lockModes are the session sql_modes LockBackend must work under: those
// of the record store (mysqlModes), and EMPTY_STRING_IS_NULL with a strict
// mode, MariaDB's default mode plus the flag, where an empty string
// literal that reaches a NOT NULL column is an error (1048) rather than a
// warning.
var lockModes = append([]mysqlSession{
	{mode: "STRICT_TRANS_TABLES,EMPTY_STRING_IS_NULL"},
	{mode: "STRICT_ALL_TABLES,ORACLE,EMPTY_STRING_IS_NULL", foundRows: true},
	{foundRows: true},
}, mysqlModes...)

// TestLockMySQLModes runs the conformance suite of package lock, and the
// row check of TestLockRowKeepsFence, under every session sql_mode of
// lockModes, in a database of its own for each.
func TestLockMySQLModes(t *testing.T) {
	t.Parallel()
	for _, m := range lockModes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			db := openMySQLModeDB(t, m)
			db.SetMaxOpenConns(4)
			b := newLockBackend(t, db, sqlstore.MySQL)
			if err := b.Migrate(t.Context()); err != nil {
				t.Fatalf("Migrate under %s: %v", m, err)
			}
			locktest.Run(t, func(*testing.T) lock.Backend { return b })

			// A release leaves the row with no owner and the fence, which
			// the next acquisition continues.
			ctx := t.Context()
			o1 := lock.NewOwner()
			f1, err := b.Acquire(ctx, "job", o1, long)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Release(ctx, "job", o1, f1); err != nil {
				t.Fatalf("Release: %v", err)
			}
			var owner []byte
			var fence int64
			if err := db.QueryRowContext(ctx, "SELECT owner, fence FROM idem_locks WHERE name = 'job'").Scan(&owner, &fence); err != nil {
				t.Fatal(err)
			}
			if len(owner) != 0 || fence != f1 {
				t.Fatalf("released row: owner %q, fence %d; want no owner, fence %d", owner, fence, f1)
			}
			f2, err := b.Acquire(ctx, "job", lock.NewOwner(), long)
			if err != nil || f2 != f1+1 {
				t.Fatalf("Acquire after Release = %d, %v; want fence %d", f2, err, f1+1)
			}
		})
	}
}
