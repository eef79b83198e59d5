package lock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/lock"
)

// blockingHandler is a slog.Handler that holds the watchdog inside its
// warning that the lease may have ended, until released.
type blockingHandler struct {
	reached chan struct{}
	release chan struct{}
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "may have ended") {
		close(h.reached)
		<-h.release
	}
	return nil
}
func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *blockingHandler) WithGroup(string) slog.Handler      { return h }

// While the watchdog reports a lease that ran out (it logs, then tells
// the observer), the lease is already over for whoever asks: Err and the
// contexts of Context answer ErrLost. The context used to be cancelled
// only after the log line, so a slow log (a full pipe, a loaded machine)
// let work that checked Err go on past the end of the lease.
func TestLeaseOverWhileItsEndIsReported(t *testing.T) {
	t.Parallel()
	const ttl = 150 * time.Millisecond
	h := newHook()
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	h.extend = func(context.Context, int) (error, bool) {
		<-unblock // the renewal hangs: the lease runs out
		return nil, true
	}
	logs := &blockingHandler{reached: make(chan struct{}), release: make(chan struct{})}
	l := newLocker(t, h, lock.Config{TTL: ttl, Logger: slog.New(logs)})
	lease := takeJob(t, l)
	ctx, cancel := lease.Context(t.Context())
	defer cancel()
	select {
	case <-logs.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the watchdog never reported the lease's end")
	}
	// The watchdog is held inside its report.
	if !errors.Is(lease.Err(), lock.ErrLost) {
		t.Errorf("lease.Err() = %v while its end is being reported, want ErrLost", lease.Err())
	}
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Errorf("the lease's context: Err %v, cause %v, while its end is being reported; want cancelled with ErrLost", ctx.Err(), context.Cause(ctx))
	}
	close(logs.release)
	waitDone(t, lease)
}
