package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/redisstore"
)

// TestMalformedRecordErrorsHideTheKey: a record the store cannot read
// (a status it does not know) is an error that reaches logs and spans:
// it names the record by its idem.HashKey, never by its scope and key.
func TestMalformedRecordErrorsHideTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := singleClient(t)
	prefix := randomPrefix()
	s := newStore(t, c, &redisstore.Config{Prefix: prefix})
	const scope, key = "user-4242", "secret-key-Zq81"
	res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	names, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	corrupted := 0
	for _, n := range names {
		if typ, _ := c.Type(ctx, n).Result(); typ == "hash" {
			if st, _ := c.HGet(ctx, n, "status").Result(); st == string(idem.StatusProcessing) {
				if err := c.HSet(ctx, n, "status", "bogus").Err(); err != nil {
					t.Fatal(err)
				}
				corrupted++
			}
		}
	}
	if corrupted != 1 {
		t.Fatalf("found %d records among %q, want 1", corrupted, names)
	}
	hash := idem.HashKey(scope, key)
	_, err = s.Get(ctx, scope, key)
	if err == nil || errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get = %v, want an error", err)
	}
	if strings.Contains(err.Error(), key) || strings.Contains(err.Error(), scope) || !strings.Contains(err.Error(), hash) {
		t.Errorf("Get's error %q shows the key, or not its hash %s", err, hash)
	}
}
