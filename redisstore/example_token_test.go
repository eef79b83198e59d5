package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/token"
)

// Tokens on Redis: each token is one key that expires with it. The
// example needs a Redis server, so it is compiled but not run;
// TestTokenExampleSteps runs the same steps against a real server.
func ExampleNewTokenStore() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.NewTokenStore(client, &redisstore.TokenConfig{Prefix: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	tokens, err := token.New(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	tok, err := tokens.Issue(ctx, "user-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(tokens.Consume(ctx, "user-42", tok.ID, token.Use{Result: []byte("order-1001")}))
	var used *token.UsedError
	if err := tokens.Consume(ctx, "user-42", tok.ID, token.Use{}); errors.As(err, &used) {
		fmt.Printf("already used: %s\n", used.Result)
	}
}
