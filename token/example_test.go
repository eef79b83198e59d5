package token_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idem/token"
)

// A checkout form carries a token issued with the page; the submission
// spends it. A second submission of the same form (a double click, a
// reload, a retry) is led to the order the first one created.
func Example() {
	ctx := context.Background()
	tokens, err := token.New(token.NewMemoryStore(), nil) // TTL 30 min
	if err != nil {
		panic(err)
	}

	// GET /checkout: render the form with a fresh token for this user.
	tok, err := tokens.Issue(ctx, "user-42")
	if err != nil {
		panic(err)
	}

	// POST /checkout, twice with the same token.
	for range 2 {
		err := tokens.Consume(ctx, "user-42", tok.ID, token.Use{Result: []byte("order-1001")})
		var used *token.UsedError
		switch {
		case err == nil:
			fmt.Println("first submission: create order-1001")
		case errors.As(err, &used):
			fmt.Printf("repeated submission: see %s\n", used.Result)
		case errors.Is(err, token.ErrInvalid):
			fmt.Println("unknown or expired form: reload it")
		default:
			panic(err)
		}
	}

	// Another user cannot spend it, nor learn that it was used.
	fmt.Println(tokens.Consume(ctx, "user-7", tok.ID, token.Use{}))
	// Output:
	// first submission: create order-1001
	// repeated submission: see order-1001
	// token: invalid or expired
}

func ExampleTokens_Issue() {
	tokens, err := token.New(token.NewMemoryStore(), nil)
	if err != nil {
		panic(err)
	}
	tok, err := tokens.Issue(context.Background(), "user-42")
	if err != nil {
		panic(err)
	}
	fmt.Println(len(tok.ID), token.ValidID(tok.ID), tok.Scope)
	// Output: 22 true user-42
}

func ExampleTokens_Consume() {
	ctx := context.Background()
	tokens, err := token.New(token.NewMemoryStore(), nil)
	if err != nil {
		panic(err)
	}
	tok, err := tokens.Issue(ctx, "user-42")
	if err != nil {
		panic(err)
	}
	fmt.Println(tokens.Consume(ctx, "user-42", tok.ID, token.Use{Result: []byte("order-1")}))
	err = tokens.Consume(ctx, "user-42", tok.ID, token.Use{Result: []byte("order-2")})
	fmt.Println(errors.Is(err, token.ErrUsed))
	var used *token.UsedError
	if errors.As(err, &used) {
		fmt.Printf("%s\n", used.Result)
	}
	// A malformed ID is refused without a call to the store.
	fmt.Println(tokens.Consume(ctx, "user-42", "../../etc/passwd", token.Use{}))
	// Output:
	// <nil>
	// true
	// order-1
	// token: invalid or expired
}

func ExampleTokens_Sweep() {
	ctx := context.Background()
	tokens, err := token.New(token.NewMemoryStore(), nil)
	if err != nil {
		panic(err)
	}
	// Run it now and then (the SQL stores need it; Redis expires by itself).
	n, err := tokens.Sweep(ctx, 0)
	fmt.Println(n, err)
	// Output: 0 <nil>
}

func ExampleDigest() {
	d, err := token.Digest("AAAAAAAAAAAAAAAAAAAAAA")
	fmt.Println(len(d), err)
	_, err = token.Digest("not-a-token")
	fmt.Println(err)
	// Output:
	// 64 <nil>
	// token: invalid or expired
}
