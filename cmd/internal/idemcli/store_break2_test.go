package idemcli

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
)

// idem sweep -every stops when its context ends (SIGINT or SIGTERM in
// main): exit 0, each pass reported on its own line, nothing after the
// stop. Held.
func TestSweepEveryStops(t *testing.T) {
	t.Parallel()
	raw, _ := storeAt(t)
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &obstest.LogBuffer{}, &obstest.LogBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"sweep", "-db", raw, "-every", "10ms"}, strings.NewReader(""), stdout, stderr)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(stdout.String(), "\n") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("sweep -every 10ms: %q %q after 10 s; want 3 reports", stdout, stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK || stderr.String() != "" {
			t.Fatalf("sweep -every stopped with exit %d, stderr %q; want 0 and nothing", code, stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sweep -every does not stop within 10 s of its context's end")
	}
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	for _, l := range lines {
		if !strings.Contains(l, ": removed 0 records, 0 tokens") {
			t.Errorf("report line %q", l)
		}
	}
}

// idem evict of a record in flight: refused without -force; with it, the
// execution still running loses its lease, and its Complete neither
// writes the record back nor succeeds, on every store; a request after
// the evict runs again (as the help says). Held.
func TestEvictInFlight(t *testing.T) {
	t.Parallel()
	for _, b := range proxyBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			flags := b.flags(t)
			st, err := storeFlags{name: "store", raw: flags[1], cache: cacheOf(flags)}.open(context.Background(), openOptions{migrate: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			key := newKey("evict")
			res, err := st.store.Acquire(ctx, idem.AcquireRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil || res.Outcome != idem.Acquired {
				t.Fatalf("Acquire: %+v %v", res, err)
			}
			args := []string{"evict", "-db", flags[1], "-scope", "s", "-key", key, "-yes"}
			if c := cacheOf(flags); c != "" {
				args = append(args, "-cache", c)
			}
			// Refused without -force: the execution may still run.
			if code, out, errOut := run(t, "", args...); code != exitFail || !strings.Contains(errOut, "in flight") {
				t.Fatalf("evict of a record in flight without -force: exit %d %q %q; want it refused", code, out, errOut)
			}
			if rec, err := st.store.Get(ctx, "s", key); err != nil || rec.Owner != res.Lease.Owner {
				t.Fatalf("after the refused evict: %+v, %v; want the record kept", rec, err)
			}
			args = append(args, "-force")
			code, out, errOut := run(t, "", args...)
			if code != exitOK || !strings.Contains(out, "deleted") {
				t.Fatalf("evict: exit %d %q %q", code, out, errOut)
			}
			err = st.store.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Body: []byte("late")}, time.Hour)
			if !errors.Is(err, idem.ErrLeaseLost) {
				t.Errorf("Complete after the evict = %v, want idem.ErrLeaseLost", err)
			}
			if rec, err := st.store.Get(ctx, "s", key); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("after the late Complete: %+v, %v; want no record", rec, err)
			}
			again, err := st.store.Acquire(ctx, idem.AcquireRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil || again.Outcome != idem.Acquired {
				t.Fatalf("Acquire after the evict: %+v %v; want Acquired", again, err)
			}
		})
	}
}

// cacheOf returns the -cache value among a backend's flags, or "".
func cacheOf(flags []string) string {
	for i := 0; i+1 < len(flags); i++ {
		if flags[i] == "-cache" {
			return flags[i+1]
		}
	}
	return ""
}
