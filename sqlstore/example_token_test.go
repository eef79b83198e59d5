package sqlstore_test

import (
	"context"

	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
	"github.com/idemkit/idem/token"
)

// A checkout form carries a token; the submission creates the order and
// spends the token in one transaction (Tokens.ConsumeTx), so both commit
// or neither does. A repeated submission is led to the order the first
// one created. The README shows checkout.
func ExampleTokenStore() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "token-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.NewTokenStore(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, user TEXT, sku TEXT)`); err != nil {
		log.Fatal(err)
	}
	tokens, err := token.New(store, &token.Config{TTL: 15 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}

	// checkout creates the order of a submitted form, once per form.
	checkout := func(ctx context.Context, user, formToken, sku string) (orderID string, err error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return "", err
		}
		defer tx.Rollback() // a no-op after Commit
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (user, sku) VALUES (?, ?)`, user, sku)
		if err != nil {
			return "", err
		}
		n, _ := res.LastInsertId()
		orderID = fmt.Sprintf("order-%d", n)
		// The form's fields, canonically: another form under this token
		// is refused (token.ErrMismatch), not led to this order.
		form := []byte("sku=" + url.QueryEscape(sku))
		err = tokens.ConsumeTx(ctx, tx, user, formToken, token.Use{Request: form, Result: []byte(orderID)})
		var used *token.UsedError
		switch {
		case errors.As(err, &used):
			return string(used.Result), nil // a repeat: the first submission's order
		case err != nil:
			return "", err // token.ErrInvalid (expired or unknown form), token.ErrMismatch
		}
		return orderID, tx.Commit()
	}

	tok, err := tokens.Issue(ctx, "user-42") // rendered into the form
	if err != nil {
		log.Fatal(err)
	}
	for range 2 { // a double click
		id, err := checkout(ctx, "user-42", tok.ID, "A-1")
		fmt.Println(id, err)
	}
	_, err = checkout(ctx, "user-42", tok.ID, "B-2") // back, another product, resubmit
	fmt.Println(errors.Is(err, token.ErrMismatch))
	_, err = checkout(ctx, "user-42", "forged-or-expired-token", "A-1")
	fmt.Println(err)
	var n int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// order-1 <nil>
	// order-1 <nil>
	// true
	// token: invalid or expired
	// orders: 1
}
