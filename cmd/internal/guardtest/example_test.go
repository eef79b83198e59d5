package guardtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idem/fsm"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
	"github.com/idemkit/idem/uniq"
)

// exampleDB opens a SQLite database in a temporary directory, with the
// tables of the examples, and returns it and a function that removes it.
func exampleDB() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "guardtest-example")
	if err != nil {
		panic(err)
	}
	db, err := sqlite.Open(context.Background(), filepath.Join(dir, "shop.db"))
	if err != nil {
		panic(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE payments (id INTEGER PRIMARY KEY, provider_ref TEXT NOT NULL UNIQUE, amount INTEGER NOT NULL)`,
		`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL, paid_at TEXT)`,
		`INSERT INTO orders (id, status, version) VALUES (42, 'WAIT_PAY', 1)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			panic(err)
		}
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// A payment provider's callback arrives twice with the same reference:
// the first call records the payment, the second reads the same row.
func Example_uniqInsertOrGet() {
	db, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()

	type payment struct {
		ID     int64
		Amount int64
	}
	record := func(ref string, amount int64) (payment, bool, error) {
		return uniq.InsertOrGet(ctx, db,
			func(ctx context.Context, q uniq.Querier) (payment, error) {
				p := payment{Amount: amount}
				err := q.QueryRowContext(ctx,
					`INSERT INTO payments (provider_ref, amount) VALUES (?, ?) RETURNING id`,
					ref, amount).Scan(&p.ID)
				return p, err
			},
			func(ctx context.Context, q uniq.Querier) (payment, error) {
				var p payment
				err := q.QueryRowContext(ctx,
					`SELECT id, amount FROM payments WHERE provider_ref = ?`, ref).Scan(&p.ID, &p.Amount)
				return p, err
			})
	}

	p, created, err := record("pi_3Nx", 1999)
	fmt.Println(p, created, err)
	p, created, err = record("pi_3Nx", 1999) // the provider's retry
	fmt.Println(p, created, err)
	// Output:
	// {1 1999} true <nil>
	// {1 1999} false <nil>
}

// IsDuplicate tells a unique violation from other errors, whatever the
// driver.
func Example_uniqIsDuplicate() {
	db, cleanup := exampleDB()
	defer cleanup()

	_, err := db.Exec(`INSERT INTO payments (provider_ref, amount) VALUES ('pi_1', 5), ('pi_1', 5)`)
	fmt.Println(uniq.IsDuplicate(err))
	_, err = db.Exec(`INSERT INTO payments (provider_ref, amount) VALUES ('pi_2', NULL)`)
	fmt.Println(uniq.IsDuplicate(err))
	// Output:
	// true
	// false
}

// An order is paid once: the provider's retry is told AlreadyApplied, and
// a late cancellation is an illegal transition that names the state.
func Example_fsmTransition() {
	db, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()

	orders := fsm.MustNew(&fsm.Definition{
		States:  []fsm.State{"NEW", "WAIT_PAY", "PAID", "CANCELLED"},
		Initial: "NEW",
		Final:   []fsm.State{"PAID", "CANCELLED"},
		Transitions: []fsm.Transition{
			{Name: "submit", From: []fsm.State{"NEW"}, To: "WAIT_PAY"},
			{Name: "pay", From: []fsm.State{"WAIT_PAY"}, To: "PAID"},
			{Name: "cancel", From: []fsm.State{"NEW", "WAIT_PAY"}, To: "CANCELLED"},
		},
	})
	table, err := fsm.NewTable(orders, &fsm.TableConfig{Dialect: sqlstore.SQLite, Table: "orders"})
	if err != nil {
		panic(err)
	}

	res, err := table.Transition(ctx, db, 42, "PAID", fsm.IfVersion(1), fsm.SetNow("paid_at"))
	fmt.Printf("%+v %v\n", res, err)
	res, err = table.Transition(ctx, db, 42, "PAID", fsm.IfVersion(1), fsm.SetNow("paid_at"))
	fmt.Printf("%+v %v\n", res, err)
	_, err = table.Fire(ctx, db, 42, "cancel")
	fmt.Println(err, errors.Is(err, fsm.ErrIllegal))
	// Output:
	// {Previous:WAIT_PAY To:PAID Version:2 AlreadyApplied:false} <nil>
	// {Previous: To:PAID Version:2 AlreadyApplied:true} <nil>
	// fsm: illegal transition of 42: it is in "PAID", and "CANCELLED" is allowed only from "NEW", "WAIT_PAY" true
}

// In a transaction, the side effect is recorded only by the caller that
// made the transition, and commits with it.
func Example_fsmTransitionTx() {
	db, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()
	table, err := fsm.NewTable(orderMachine, &fsm.TableConfig{Dialect: sqlstore.SQLite, Table: "orders"})
	if err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE receipts (order_id INTEGER PRIMARY KEY)`); err != nil {
		panic(err)
	}

	pay := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		res, err := table.Fire(ctx, tx, 42, "pay")
		if err != nil {
			return err
		}
		if !res.AlreadyApplied {
			if _, err := tx.ExecContext(ctx, `INSERT INTO receipts (order_id) VALUES (42)`); err != nil {
				return err
			}
		}
		return tx.Commit()
	}
	fmt.Println(pay(), pay())
	var receipts int
	_ = db.QueryRow(`SELECT COUNT(*) FROM receipts`).Scan(&receipts)
	fmt.Println(receipts)
	// Output:
	// <nil> <nil>
	// 1
}
