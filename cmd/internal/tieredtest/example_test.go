package tieredtest_test

import (
	"context"
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/sqlstore/sqlite"
	"github.com/idemkit/idem/tieredstore"
)

// Redis in front of SQLite, behind the HTTP middleware: tieredstore.New
// over a sqlstore truth. (Not run: it needs a Redis server.)
func Example() {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, "data/idem.db")
	if err != nil {
		log.Fatal(err)
	}
	truth, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := truth.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// ContextTimeoutEnabled lets Config.Timeout end a stalled socket read
	// too, not only the Store's wait for it.
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	store, err := tieredstore.New(client, truth, nil) // Timeout 50ms, Cooldown 1s
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(&idemhttp.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated) // the effect runs once per key
	})))
}
