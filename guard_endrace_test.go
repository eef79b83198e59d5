package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/memstore"
)

// blockingLog holds the watchdog inside its warning that the lease may
// have ended, until released.
type blockingLog struct {
	reached chan struct{}
	release chan struct{}
}

func (h *blockingLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "may have ended") {
		close(h.reached)
		<-h.release
	}
	return nil
}
func (h *blockingLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *blockingLog) WithGroup(string) slog.Handler      { return h }

// While the watchdog reports an execution whose lease ran out, the
// execution is already over for its work: its context answers
// ErrLeaseLost. It used to be cancelled only after the log line, so a
// slow log let work that checked the context go on past the lease.
func TestGuardOverWhileItsEndIsReported(t *testing.T) {
	t.Parallel()
	mem := memstore.New(nil)
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	s := &hookStore{Store: mem}
	s.extend = func(ctx context.Context, l idem.Lease, ttl time.Duration) (idem.Lease, error) {
		<-unblock // the renewal hangs: the lease runs out
		return l, nil
	}
	logs := &blockingLog{reached: make(chan struct{}), release: make(chan struct{})}
	g := newGuard(t, s, &idem.GuardConfig{Lease: 150 * time.Millisecond, Logger: slog.New(logs)})
	exec := begin(t, g, "k")
	defer exec.Abandon()
	select {
	case <-logs.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the watchdog never reported the lease's end")
	}
	ctx := exec.Context()
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
		t.Errorf("the execution's context: Err %v, cause %v, while its end is being reported; want cancelled with ErrLeaseLost", ctx.Err(), context.Cause(ctx))
	}
	close(logs.release)
}
