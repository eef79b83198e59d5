package lincheck_test

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/cmd/internal/lincheck"
	"github.com/idemkit/idem/internal/redisproc"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/redisstore"
)

// redisCluster starts a Redis Cluster of three masters on loopback for t
// and returns a client of it.
func redisCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		testenv.Unavailable(t, "redis-cli", "PATH", err)
	}
	var addrs []string
	for range 3 {
		bus, err := redisproc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s := redisproc.Start(t, redisproc.Options{Args: []string{"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus)}})
		addrs = append(addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	if out, err := exec.CommandContext(ctx, "redis-cli", append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("node %s: the cluster is not ok: %v", addr, errors.Join(err, ctx.Err()))
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 32, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRedisCluster: the Redis store, lock backend and token store on a
// Redis Cluster of three masters, each key's calls on its node.
func TestRedisCluster(t *testing.T) {
	c := redisCluster(t)
	t.Run("store", func(t *testing.T) {
		s, err := redisstore.New(c, &redisstore.Config{Prefix: testdb.RandomName("lin")})
		if err != nil {
			t.Fatal(err)
		}
		checkStore(t, s, lincheck.StoreModelConfig{DropsExpired: true, SendsAgain: true},
			lincheck.StoreWorkload{Sweep: true, Keys: 9})
	})
	t.Run("lock", func(t *testing.T) {
		b, err := redisstore.NewLockBackend(c, &redisstore.LockConfig{Prefix: testdb.RandomName("lin")})
		if err != nil {
			t.Fatal(err)
		}
		h, counts := lincheck.RunLocks(context.Background(), b, lincheck.LockWorkload{Names: 6, SplitResend: true})
		t.Logf("%v", counts)
		h.Check(t, lincheck.LockModel(margin))
	})
	t.Run("token", func(t *testing.T) {
		s, err := redisstore.NewTokenStore(c, &redisstore.TokenConfig{Prefix: testdb.RandomName("lin")})
		if err != nil {
			t.Fatal(err)
		}
		h, counts := lincheck.RunTokens(context.Background(), s, lincheck.TokenWorkload{Sweep: true})
		t.Logf("%v", counts)
		h.Check(t, lincheck.TokenModel(margin, true))
	})
}
