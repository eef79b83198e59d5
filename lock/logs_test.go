package lock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/lock"
)

// TestLogsHashNames: the watchdog's warnings (a renewal that failed, a
// renewal refused) identify the lock by the hash of its name
// (idem.key_hash, as the Observer's events do) and never carry the name,
// which may hold an identifier.
func TestLogsHashNames(t *testing.T) {
	t.Parallel()
	const name = "order-NAME-66120"
	var buf obstest.LogBuffer
	h := newHook()
	h.extend = func(_ context.Context, n int) (error, bool) {
		if n == 0 {
			return errors.New("connection reset"), true
		}
		return lock.ErrNotHeld, true
	}
	// The failed renewal's retry must reach the backend (and be refused)
	// before the lease runs out, on a loaded machine too: with 300 ms, a
	// timer 200 ms late ended it "may have ended", with no refusal.
	l := newLocker(t, h, lock.Config{TTL: 1500 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	lease, err := l.TryAcquire(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease)
	if !errors.Is(lease.Err(), lock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", lease.Err())
	}
	// The lease ends (Done) before the watchdog logs why: wait for the
	// line.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(buf.String(), "renewal refused") && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	out := buf.String()
	hash := `"idem.key_hash":"` + idem.HashKey("lock", name) + `"`
	for _, want := range []string{"lock: lease renewal failed", "lock: lease lost: renewal refused", hash, `"idem.fence":`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, name) {
		t.Errorf("the lock's name in the log:\n%s", out)
	}
}
