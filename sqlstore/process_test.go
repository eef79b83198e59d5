package sqlstore_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/sqlstore"
)

// Environment of a TestMultiProcess child.
const (
	envChildDialect = "SQLSTORE_TEST_CHILD_DIALECT"
	envChildDB      = "SQLSTORE_TEST_CHILD_DB" // the SQLite file
	envChildScope   = "SQLSTORE_TEST_CHILD_SCOPE"
	envChildStart   = "SQLSTORE_TEST_CHILD_START"
)

const (
	mpProcesses  = 4
	mpGoroutines = 25
	mpKeys       = 20
)

// TestMultiProcess re-executes the test binary: 4 processes, each with 25
// goroutines, race Acquire on the same 20 keys of one database (after all
// of them ran Migrate at once: on SQLite, on a new file). Across processes
// exactly one Acquire per key wins; the winner completes the key with its
// owner token as the body, and the stored record must be the winner's.
// It runs on SQLite and on each server.
func TestMultiProcess(t *testing.T) {
	if d := os.Getenv(envChildDialect); d != "" {
		multiProcessChild(t, d)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "shared.db")
		multiProcess(t, sqlstore.SQLite, path, func() *sqlstore.Store { return newStore(t, openDB(t, path)) })
	})
	forServers(t, func(t *testing.T, srv server) {
		_, s := srv.setup(t) // skips if the server is down
		multiProcess(t, srv.dialect, "", func() *sqlstore.Store { return s })
	})
}

func multiProcess(t *testing.T, d sqlstore.Dialect, path string, open func() *sqlstore.Store) {
	scope := randomName("mp-")
	start := time.Now().Add(1500 * time.Millisecond) // every child is up and migrated by then

	type child struct {
		cmd            *exec.Cmd
		stdout, stderr bytes.Buffer
	}
	var children []*child
	for range mpProcesses {
		c := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestMultiProcess$", "-test.count=1")}
		c.cmd.Env = append(os.Environ(),
			envChildDialect+"="+d.String(), envChildDB+"="+path, envChildScope+"="+scope,
			envChildStart+"="+strconv.FormatInt(start.UnixMilli(), 10))
		c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, c)
	}
	winners := map[string][]string{} // key → owners told Acquired
	outcomes := map[string]int{}
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\nstdout:\n%s\nstderr:\n%s", i, err, c.stdout.String(), c.stderr.String())
		}
		sc := bufio.NewScanner(&c.stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 || f[0] != "OUTCOME" {
				continue
			}
			outcomes[f[1]]++
			if f[1] == idem.Acquired.String() {
				winners[f[2]] = append(winners[f[2]], f[3])
			}
		}
	}
	total := 0
	for _, n := range outcomes {
		total += n
	}
	if want := mpProcesses * mpGoroutines * mpKeys; total != want {
		t.Fatalf("children reported %d outcomes, want %d: %v", total, want, outcomes)
	}

	s := open()
	for k := range mpKeys {
		key := fmt.Sprintf("key-%d", k)
		if len(winners[key]) != 1 {
			t.Errorf("%s: %d processes were told Acquired (%v), want 1", key, len(winners[key]), winners[key])
			continue
		}
		rec, err := s.Get(t.Context(), scope, key)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != idem.StatusCompleted || rec.Fence != 1 || string(rec.Response.Body) != winners[key][0] {
			t.Errorf("%s: record %+v is not the winner %s's", key, rec, winners[key][0])
		}
	}
	t.Logf("%d processes × %d goroutines × %d keys: %v", mpProcesses, mpGoroutines, mpKeys, outcomes)
}

func multiProcessChild(t *testing.T, dialect string) {
	ctx := context.Background()
	startMS, err := strconv.ParseInt(os.Getenv(envChildStart), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	scope := os.Getenv(envChildScope)
	var s *sqlstore.Store
	if dialect == sqlstore.SQLite.String() {
		s = newStore(t, openDB(t, os.Getenv(envChildDB)))
	}
	for _, srv := range servers {
		if srv.dialect.String() == dialect {
			db := srv.open(t, "")
			if s, err = sqlstore.New(db, &sqlstore.Config{Dialect: srv.dialect}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s == nil {
		t.Fatalf("unknown dialect %q", dialect)
	}
	if err := s.Migrate(ctx); err != nil { // the children migrate at once
		t.Fatalf("Migrate: %v", err)
	}
	time.Sleep(time.Until(time.UnixMilli(startMS)))

	var mu sync.Mutex
	var lines []string
	var errs []error
	race(mpGoroutines, func(g int) {
		for i := range mpKeys {
			key := fmt.Sprintf("key-%d", (i+g)%mpKeys) // goroutines start on different keys
			res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err == nil && res.Outcome == idem.Acquired {
				err = s.Complete(ctx, res.Lease, idem.Response{StatusCode: 200, Body: []byte(res.Lease.Owner)}, time.Hour)
			}
			mu.Lock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", key, err))
			} else {
				lines = append(lines, fmt.Sprintf("OUTCOME %s %s %s", res.Outcome, key, res.Lease.Owner))
			}
			mu.Unlock()
		}
	})
	for _, l := range lines {
		fmt.Println(l)
	}
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
}
