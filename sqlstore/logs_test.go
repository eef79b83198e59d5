package sqlstore_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/sqlstore"
)

// TestLogsHashKeys: the line the store logs when it takes over a key
// whose lease ended identifies the key by its hash (idem.key_hash) and
// carries neither the scope nor the key.
func TestLogsHashKeys(t *testing.T) {
	t.Parallel()
	const scope, key = "tenant-SCOPE-5527", "key-KEY-8841"
	var buf obstest.LogBuffer
	db := openDB(t, filepath.Join(t.TempDir(), "idem.db"))
	s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.SQLite,
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: 20 * time.Millisecond, Retention: time.Hour}
	if res, err := s.Acquire(t.Context(), r); err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("first Acquire: %+v, %v", res, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := s.Acquire(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == idem.Acquired {
			if !res.TookOver {
				t.Fatalf("second Acquire did not take over: %+v", res)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease never ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	out := buf.String()
	if !strings.Contains(out, "sqlstore: took over an expired lease") ||
		!strings.Contains(out, `"idem.key_hash":"`+idem.HashKey(scope, key)+`"`) || !strings.Contains(out, `"idem.fence":2`) {
		t.Errorf("the takeover line is missing or lacks the key's hash and fence:\n%s", out)
	}
	if strings.Contains(out, scope) || strings.Contains(out, key) {
		t.Errorf("raw scope or key in the log:\n%s", out)
	}
}
