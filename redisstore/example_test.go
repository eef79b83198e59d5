package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/redisstore"
)

// The example needs a Redis server, so it is compiled but not run; the
// tests run the same steps against a real server.
func ExampleNew() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.New(client, &redisstore.Config{Prefix: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	req := idem.AcquireRequest{
		Scope:       "tenant-1",
		Key:         "order-42",
		Fingerprint: "sha256:…",
		Lease:       30 * time.Second,
		Retention:   24 * time.Hour,
	}

	first, err := store.Acquire(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first:", first.Outcome, "fence", first.Lease.Fence)

	if err := store.Complete(ctx, first.Lease, idem.Response{StatusCode: 201, Body: []byte(`{"id":42}`)}, 24*time.Hour); err != nil {
		log.Fatal(err)
	}

	retry, err := store.Acquire(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry:", retry.Outcome, retry.Record.Response.StatusCode, string(retry.Record.Response.Body))
}

// A Redis Cluster: every record lives in one slot, chosen by its hash tag.
func ExampleNew_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
	})
	defer client.Close()
	store, err := redisstore.New(client, nil)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idem.NewGuard(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	_ = guard // guard.Do(ctx, scope, key, fingerprint, work)
}
