package tieredtest_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/rediskey"
	"github.com/idemkit/idem/tieredstore"
)

// TestLogsHashKeys: the line the store logs when it ignores a malformed
// cache entry identifies the record by its hash (idem.key_hash) and
// carries neither the scope, nor the key, nor the entry's name (which
// encodes both); the Acquire falls through to the truth.
func TestLogsHashKeys(t *testing.T) {
	t.Parallel()
	const scope, key = "tenant-SCOPE-1187", "key-KEY-2294"
	rc := redisClient(t)
	_, truth := newTruth(t)
	var buf obstest.LogBuffer
	prefix := randomPrefix()
	s := newTiered(t, rc, rc, truth, &tieredstore.Config{Prefix: prefix,
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	name := rediskey.Name(prefix, scope, key)
	if err := rc.Set(context.Background(), name, "not an entry", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Acquire(context.Background(), idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp",
		Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Acquire over a malformed entry: %+v, %v", res, err)
	}
	out := buf.String()
	if !strings.Contains(out, "tieredstore: ignoring a cache entry") ||
		!strings.Contains(out, `"idem.key_hash":"`+idem.HashKey(scope, key)+`"`) {
		t.Errorf("the line is missing or lacks the key's hash:\n%s", out)
	}
	if strings.Contains(out, scope) || strings.Contains(out, key) || strings.Contains(out, name[len(prefix):]) {
		t.Errorf("the scope, key or entry name in the log:\n%s", out)
	}
}
