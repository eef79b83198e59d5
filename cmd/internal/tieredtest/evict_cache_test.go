package tieredtest_test

import (
	"context"
	"encoding/base64"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
	"github.com/idemkit/idem/tieredstore"
)

// delFailing is a Redis client whose DEL fails while fail is set; GET and
// SET go to the server.
type delFailing struct {
	*redis.Client
	fail atomic.Bool
}

func (c *delFailing) Del(ctx context.Context, keys ...string) *redis.IntCmd {
	if c.fail.Load() {
		cmd := redis.NewIntCmd(ctx)
		cmd.SetErr(errors.New("connection refused"))
		return cmd
	}
	return c.Client.Del(ctx, keys...)
}

// TestEvictionCacheEntryKept: an eviction whose Redis delete fails leaves
// the completed entry answering replays of a record the truth no longer
// has. Delete and DeleteIf must say so (ErrCacheEntryKept), never answer
// as if the record were gone; a second Delete once Redis answers removes
// the entry, and the key runs again.
func TestEvictionCacheEntryKept(t *testing.T) {
	t.Parallel()
	rc := redisClient(t)
	for _, how := range []string{"Delete", "DeleteIf"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			front := &delFailing{Client: rc}
			truth := memstore.New(nil)
			prefix := randomPrefix()
			s := newTiered(t, front, rc, truth, &tieredstore.Config{Prefix: prefix})
			entry := prefix + ":{" + base64.RawURLEncoding.EncodeToString([]byte("tenant")) + "." + base64.RawURLEncoding.EncodeToString([]byte("k")) + "}"
			ctx := t.Context()
			res, err := s.Acquire(ctx, req("k", "fp"))
			if err != nil || res.Outcome != idem.Acquired {
				t.Fatalf("Acquire = %v, %v", res.Outcome, err)
			}
			if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("done")}, time.Hour); err != nil {
				t.Fatal(err)
			}
			front.fail.Store(true)
			if how == "Delete" {
				err = s.Delete(ctx, "tenant", "k")
			} else {
				err = s.(idem.ConditionalDeleter).DeleteIf(ctx, "tenant", "k", res.Lease.Owner, res.Lease.Fence)
			}
			if !errors.Is(err, tieredstore.ErrCacheEntryKept) {
				t.Fatalf("%s with Redis' DEL failing = %v; want ErrCacheEntryKept", how, err)
			}
			if _, err := truth.Get(ctx, "tenant", "k"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("truth after %s = %v; want the record deleted", how, err)
			}
			// What the error warns of: the completed entry is still there.
			if n, err := rc.Exists(ctx, entry).Result(); err != nil || n != 1 {
				t.Fatalf("EXISTS %s = %d, %v; want the entry the error warns of", entry, n, err)
			}
			front.fail.Store(false)
			if err := s.Delete(ctx, "tenant", "k"); !errors.Is(err, idem.ErrNotFound) || errors.Is(err, tieredstore.ErrCacheEntryKept) {
				t.Fatalf("Delete again once Redis answers = %v; want ErrNotFound alone", err)
			}
			if n, err := rc.Exists(ctx, entry).Result(); err != nil || n != 0 {
				t.Fatalf("EXISTS %s after the second Delete = %d, %v; want it gone", entry, n, err)
			}
			if r, err := s.Acquire(ctx, req("k", "fp")); err != nil || r.Outcome != idem.Acquired {
				t.Fatalf("Acquire after the second Delete = %v, %v; want acquired", r.Outcome, err)
			}
		})
	}
}
