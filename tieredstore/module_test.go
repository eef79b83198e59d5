package tieredstore_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/tieredstore"
)

// TestConformanceOverMemstore runs the conformance suite against the shared
// Redis in front of a memstore truth. The suite over sqlstore truths (and
// the outage, retry and race tests) lives in the cmd module, package
// cmd/internal/tieredtest, so that this module requires no SQL driver;
// this test keeps the module's own suite (GOWORK=off) talking to Redis.
func TestConformanceOverMemstore(t *testing.T) {
	addr := testenv.Redis.Need(t)
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		testenv.Unavailable(t, testenv.Redis.Name, testenv.Redis.Var, err)
	}
	prefix := "tieredmod-" + strings.ToLower(rand.Text()[:12])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var keys []string
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		err := iter.Err()
		if err == nil && len(keys) > 0 {
			err = c.Del(ctx, keys...).Err()
		}
		if err != nil {
			t.Errorf("cleanup of %s:*: %v", prefix, err)
		}
	})
	s, err := tieredstore.New(c, memstore.New(nil), &tieredstore.Config{Prefix: prefix, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	storetest.Run(t, func(*testing.T) idem.Store { return s }, storetest.Caps{Precision: time.Millisecond})
	if st := s.Stats(); st.Hits == 0 || st.Errors != 0 {
		t.Errorf("stats after the suite: %+v; want hits and no Redis errors", st)
	}
}

// TestConditionalDeleterFollowsTruth: the store has DeleteIf exactly when
// its truth does, with or without CompleteTx; the cases with CompleteTx
// are in cmd/internal/tieredtest.
func TestConditionalDeleterFollowsTruth(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		name  string
		truth idem.Store
		cd    bool
	}{
		{"memstore", memstore.New(nil), true},
		{"a store without DeleteIf", struct{ idem.Store }{memstore.New(nil)}, false},
	} {
		s, err := tieredstore.New(c, tc.truth, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := idem.Store(s).(idem.ConditionalDeleter); ok != tc.cd {
			t.Errorf("New over %s: %T implements idem.ConditionalDeleter = %v, want %v", tc.name, s, ok, tc.cd)
		}
	}
}
