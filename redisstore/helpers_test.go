package redisstore_test

import (
	"context"
	"crypto/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/redisstore"
)

// singleClient returns a client of the Redis server at IDEM_REDIS_ADDR, or
// skips t (fails it under IDEM_REQUIRE_SERVICES=1).
func singleClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := testenv.Redis.Need(t)
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unavailable(t, testenv.Redis.Name, testenv.Redis.Var, err)
	}
	return c
}

// offlineClient returns a client of a closed loopback port that gives up
// at once: New cannot read the server's policy and goes on, and every
// operation fails.
func offlineClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// randomPrefix returns a key prefix no other test or run uses.
func randomPrefix() string {
	return "idemtest-" + strings.ToLower(rand.Text()[:12])
}

// newStore returns a store with a random prefix (unless cfg sets one) and
// deletes its keys when t ends.
func newStore(t testing.TB, c redisstore.Client, cfg *redisstore.Config) *redisstore.Store {
	t.Helper()
	var conf redisstore.Config
	if cfg != nil {
		conf = *cfg
	}
	if conf.Prefix == "" {
		conf.Prefix = randomPrefix()
	}
	s, err := redisstore.New(c, &conf)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { deletePrefix(t, c, conf.Prefix) })
	return s
}

// deletePrefix deletes every key of prefix, on every node.
func deletePrefix(t testing.TB, c redisstore.Client, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := func(ctx context.Context, n *redis.Client) error {
		iter := n.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		p := n.Pipeline()
		for iter.Next(ctx) {
			p.Unlink(ctx, iter.Val())
			if p.Len() >= 1000 {
				if _, err := p.Exec(ctx); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		_, err := p.Exec(ctx)
		return err
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, del)
	case *redis.Client:
		err = del(ctx, c)
	default:
		t.Fatalf("deletePrefix: unexpected client %T", c)
	}
	if err != nil {
		t.Errorf("cleaning up keys of prefix %q: %v", prefix, err)
	}
}

// countPrefix returns how many keys of prefix exist, on every node.
func countPrefix(t testing.TB, c redisstore.Client, prefix string) int {
	t.Helper()
	ctx := context.Background()
	total := 0
	count := func(ctx context.Context, n *redis.Client) error {
		keys, err := n.Keys(ctx, prefix+":*").Result()
		total += len(keys)
		return err
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		// ForEachMaster is concurrent: count node by node.
		var (
			mu    sync.Mutex
			nodes []*redis.Client
		)
		err = c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
			mu.Lock()
			nodes = append(nodes, n)
			mu.Unlock()
			return nil
		})
		for _, n := range nodes {
			if err == nil {
				err = count(ctx, n)
			}
		}
	case *redis.Client:
		err = count(ctx, c)
	}
	if err != nil {
		t.Fatalf("counting keys of prefix %q: %v", prefix, err)
	}
	return total
}
