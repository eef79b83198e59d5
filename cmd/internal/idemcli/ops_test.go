package idemcli

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/steps"
)

// opsFixture is a migrated database with three operations of steps made
// through the real API: "refund" for order-1 in scope tenant-1 (dead: its
// second step failed its only attempt, after its first step
// checkpointed), "ship" for order-2 (waiting: failed once, retried in an
// hour) and "ship" for order-3 (done, retained a millisecond).
type opsFixture struct {
	raw string
	j   *sqlstore.StepJournal
}

// badError is the dead operation's error: a terminal escape sequence that
// idem ops must not print as it is.
const badError = "carrier down \x1b]0;pwned\x07"

func opsSetup(t *testing.T, raw string) *opsFixture {
	t.Helper()
	ctx := context.Background()
	if code, out, errOut := run(t, "", "migrate", "-db", raw); code != exitOK || !strings.Contains(out, "idem_ops, idem_steps") {
		t.Fatalf("migrate: exit %d %q %q; want the tables of steps listed", code, out, errOut)
	}
	st, err := storeFlags{name: "db", raw: raw}.open(ctx, openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	j, err := sqlstore.NewStepJournal(st.db, &sqlstore.Config{Dialect: st.dialect})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	runner := func(max int, retention time.Duration) *steps.Runner {
		g, err := idem.NewGuard(st.sql, &idem.GuardConfig{Retention: retention})
		if err != nil {
			t.Fatal(err)
		}
		r, err := steps.New(g, j, &steps.Config{MaxAttempts: max, Backoff: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	refund, err := steps.Define(runner(1, time.Hour), "refund", func(ctx context.Context, s *steps.Run, order string) (string, error) {
		if _, err := steps.Foreign(s, "charge", func(ctx context.Context, key string) (string, error) { return "ch_1", nil }); err != nil {
			return "", err
		}
		return steps.Foreign(s, "notify", func(ctx context.Context, key string) (string, error) { return "", errors.New(badError) })
	}, &steps.OpConfig[string, string]{Key: func(order string) (string, string, error) { return "tenant-1", "refund-" + order, nil }})
	if err != nil {
		t.Fatal(err)
	}
	ship, err := steps.Define(runner(5, time.Millisecond), "ship", func(ctx context.Context, s *steps.Run, order string) (string, error) {
		return steps.Foreign(s, "carrier", func(ctx context.Context, key string) (string, error) {
			if order == "order-2" {
				return "", errors.New("carrier unavailable")
			}
			return "shp_1", nil
		})
	}, &steps.OpConfig[string, string]{Key: func(order string) (string, string, error) { return "", "ship-" + order, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := refund.Call(ctx, "order-1"); err == nil {
		t.Fatal("refund of order-1 succeeded")
	}
	if _, _, err := ship.Call(ctx, "order-2"); err == nil {
		t.Fatal("ship of order-2 succeeded")
	}
	if _, _, err := ship.Call(ctx, "order-3"); err != nil {
		t.Fatal(err)
	}
	f := &opsFixture{raw: raw, j: j}
	for key, want := range map[string]steps.State{"refund-order-1": steps.StateDead, "ship-order-2": steps.StateWaiting, "ship-order-3": steps.StateDone} {
		if got := f.get(t, key).State; got != want {
			t.Fatalf("operation %s is %s, want %s", key, got, want)
		}
	}
	return f
}

func (f *opsFixture) get(t *testing.T, key string) steps.Entry {
	t.Helper()
	scope := ""
	if strings.HasPrefix(key, "refund-") {
		scope = "tenant-1"
	}
	e, err := f.j.Get(context.Background(), scope, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return e
}

// due reports whether the completer of name would take key up now (by
// the database's clock).
func (f *opsFixture) due(t *testing.T, name, key string) bool {
	t.Helper()
	ops, err := f.j.Due(context.Background(), name, 100)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ops, func(op steps.Entry) bool { return op.Key == key })
}

// idem ops lists and shows operations, and idem retry makes a dead or a
// waiting one due now, on every SQL database.
func TestOpsAndRetry(t *testing.T) {
	t.Parallel()
	for _, c := range migrateTargets {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			raw, _, _ := c.setup(t)
			f := opsSetup(t, raw)

			code, out, errOut := run(t, "", "ops", "-db", raw)
			if code != exitOK || !strings.Contains(out, "Dead operations (1):") ||
				!strings.Contains(out, `scope="tenant-1" key="refund-order-1" name="refund" dead attempts=1 next=-`) ||
				!strings.Contains(out, `error="carrier down \x1b]0;pwned\a"`) || strings.Contains(out, "ship-") {
				t.Fatalf("ops: exit %d %q\n%s", code, errOut, out)
			}
			if strings.ContainsRune(out, '\x1b') {
				t.Fatalf("ops prints the error's escape sequence as it is:\n%q", out)
			}
			code, out, _ = run(t, "", "ops", "-db", raw, "-state", "waiting", "-n", "5")
			if code != exitOK || !strings.Contains(out, "Waiting operations (1):") || !strings.Contains(out, `key="ship-order-2" name="ship" waiting attempts=1`) ||
				!strings.Contains(out, `error="carrier unavailable"`) {
				t.Fatalf("ops -state waiting: exit %d\n%s", code, out)
			}
			if code, out, _ = run(t, "", "ops", "-db", raw, "-state", "running"); code != exitOK || !strings.Contains(out, "Running operations (0):\n  none") {
				t.Fatalf("ops -state running: exit %d\n%s", code, out)
			}

			code, out, errOut = run(t, "", "ops", "-db", raw, "-scope", "tenant-1", "-key", "refund-order-1")
			for _, want := range []string{"state        dead", "attempts     1", "checkpoints  1", "  charge  6 bytes", `    "ch_1"`, `last error   "carrier down`} {
				if code != exitOK || !strings.Contains(out, want) {
					t.Errorf("ops -key: exit %d %q; output lacks %q:\n%s", code, errOut, want, out)
				}
			}
			if code, _, errOut := run(t, "", "ops", "-db", raw, "-key", "refund-order-1"); code != exitFail || !strings.Contains(errOut, "no operation") {
				t.Errorf("ops -key in the wrong scope: exit %d %q", code, errOut)
			}

			// A done operation has nothing to retry.
			code, _, errOut = run(t, "", "retry", "-db", raw, "-key", "ship-order-3", "-yes")
			if code != exitFail || !strings.Contains(errOut, "the operation is done") || !strings.Contains(errOut, steps.ErrNotRetryable.Error()) {
				t.Fatalf("retry of a done operation: exit %d %q", code, errOut)
			}
			// Unconfirmed: nothing changes.
			for _, answer := range []string{"", "n\n"} {
				code, out, errOut = run(t, answer, "retry", "-db", raw, "-scope", "tenant-1", "-key", "refund-order-1")
				if code != exitFail || !strings.Contains(out, "Retry this operation? [y/N]") || !strings.Contains(errOut, "not retried") {
					t.Fatalf("retry answered %q: exit %d %q %q", answer, code, out, errOut)
				}
				if e := f.get(t, "refund-order-1"); e.State != steps.StateDead || e.Attempts != 1 {
					t.Fatalf("after an unconfirmed retry: %s, %d attempts; want dead, 1", e.State, e.Attempts)
				}
			}
			// Confirmed: waiting, attempts from 0, due now.
			code, out, errOut = run(t, "y\n", "retry", "-db", raw, "-scope", "tenant-1", "-key", "refund-order-1")
			if code != exitOK || !strings.Contains(out, "retried: ") {
				t.Fatalf("retry: exit %d %q %q", code, out, errOut)
			}
			if e := f.get(t, "refund-order-1"); e.State != steps.StateWaiting || e.Attempts != 0 || len(e.Checkpoints) != 1 {
				t.Fatalf("after the retry: %s, %d attempts, %d checkpoints; want waiting, 0, the checkpoint kept", e.State, e.Attempts, len(e.Checkpoints))
			}
			if !f.due(t, "refund", "refund-order-1") {
				t.Fatal("the retried operation is not due")
			}
			// A waiting operation is made due now, its attempts kept.
			if f.due(t, "ship", "ship-order-2") {
				t.Fatal("the waiting operation is due before its retry")
			}
			if code, _, errOut := run(t, "", "retry", "-db", raw, "-key", "ship-order-2", "-yes"); code != exitOK {
				t.Fatalf("retry -yes of the waiting operation: exit %d %q", code, errOut)
			}
			if e := f.get(t, "ship-order-2"); e.State != steps.StateWaiting || e.Attempts != 1 || !f.due(t, "ship", "ship-order-2") {
				t.Fatalf("after the retry: %s, %d attempts, due %v; want waiting, 1, due", e.State, e.Attempts, f.due(t, "ship", "ship-order-2"))
			}
			if code, _, errOut := run(t, "", "retry", "-db", raw, "-key", "no-such-op", "-yes"); code != exitFail || !strings.Contains(errOut, "no operation") {
				t.Fatalf("retry of nothing: exit %d %q", code, errOut)
			}

			// sweep removes the done operation once its retention ended,
			// and leaves the others.
			deadline := time.Now().Add(5 * time.Second)
			for e := f.get(t, "ship-order-3"); time.Now().Before(e.ExpiresAt.Add(5 * time.Millisecond)); {
				if time.Now().After(deadline) {
					t.Fatal("the done operation does not expire")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if code, out, errOut := run(t, "", "sweep", "-db", raw); code != exitOK || !strings.Contains(out, ", 1 operations") {
				t.Fatalf("sweep: exit %d %q %q; want 1 operation removed", code, out, errOut)
			}
			if _, err := f.j.Get(context.Background(), "", "ship-order-3"); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("the done operation after the sweep: %v; want it removed", err)
			}
			f.get(t, "refund-order-1")
			f.get(t, "ship-order-2")
		})
	}
}

// Operations live in SQL only: a Redis -db is refused before it is
// dialled, with the reason.
func TestOpsUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ops", "-db", "redis://127.0.0.1:1/0"}, "SQL database only"},
		{[]string{"retry", "-db", "redis://127.0.0.1:1/0", "-key", "k"}, "SQL database only"},
		{[]string{"ops"}, "-db is required"},
		{[]string{"ops", "-db", "sqlite:x.db", "-state", "lost"}, `-state "lost"`},
		{[]string{"ops", "-db", "sqlite:x.db", "-n", "0"}, "-n must be positive"},
		{[]string{"ops", "-db", "sqlite:x.db", "-scope", "s"}, "-key is required"},
		{[]string{"retry", "-db", "sqlite:x.db"}, "-key is required"},
		{[]string{"retry", "-db", "sqlite:x.db", "-key", "k", "stray"}, "unexpected argument"},
	} {
		code, _, errOut := run(t, "", c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("idem %q: exit %d %q; want exit 2 naming %s", c.args, code, errOut, c.want)
		}
	}
}
