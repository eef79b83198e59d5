package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/redisstore"
)

// The example needs a Redis server, so it is compiled but not run; the
// tests (TestLockConformance) run the same steps against a real server.
// A Redis lock is an efficiency lock: see LockBackend.
func ExampleNewLockBackend() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	backend, err := redisstore.NewLockBackend(client, &redisstore.LockConfig{Prefix: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	locker, err := lock.New(backend, &lock.Config{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	lease, err := locker.TryAcquire(ctx, "rebuild-search-index")
	if err != nil {
		log.Fatal(err) // lock.ErrHeld: another instance is at it
	}
	defer lease.Release(ctx)
	work, cancel := lease.Context(ctx) // cancelled if the lease is lost
	defer cancel()
	fmt.Println("fence", lease.Fence(), work.Err())
}
