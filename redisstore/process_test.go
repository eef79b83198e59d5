package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/redisstore"
)

// Environment of a child process of TestRaceProcesses.
const (
	childPrefixVar = "REDISSTORE_TEST_CHILD_PREFIX"
	childAddrsVar  = "REDISSTORE_TEST_CHILD_ADDRS" // comma-separated; more than one means a cluster
	childStartVar  = "REDISSTORE_TEST_CHILD_START" // unix nanoseconds
)

// TestRaceProcesses races Acquire on one key from several processes (the
// test binary, run again), each with many goroutines: exactly one call in
// all of them acquires.
func TestRaceProcesses(t *testing.T) {
	if prefix := os.Getenv(childPrefixVar); prefix != "" {
		raceChild(t, prefix)
		return
	}
	for _, setup := range []struct {
		name  string
		addrs func(t *testing.T) (redisstore.Client, []string)
	}{
		{"single", func(t *testing.T) (redisstore.Client, []string) {
			c := singleClient(t)
			return c, []string{c.Options().Addr}
		}},
		{"cluster", func(t *testing.T) (redisstore.Client, []string) {
			c := clusterClient(t)
			return c, c.Options().Addrs
		}},
	} {
		t.Run(setup.name, func(t *testing.T) {
			c, addrs := setup.addrs(t)
			prefix := randomPrefix()
			s := newStore(t, c, &redisstore.Config{Prefix: prefix})
			const procs = 4
			start := time.Now().Add(time.Second)
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				total   int
				outputs []string
			)
			re := regexp.MustCompile(`acquired=(\d+)`)
			for range procs {
				wg.Go(func() {
					cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestRaceProcesses$", "-test.v", "-test.count=1")
					cmd.Env = append(os.Environ(),
						childPrefixVar+"="+prefix,
						childAddrsVar+"="+strings.Join(addrs, ","),
						childStartVar+"="+strconv.FormatInt(start.UnixNano(), 10))
					out, err := cmd.CombinedOutput()
					mu.Lock()
					defer mu.Unlock()
					m := re.FindSubmatch(out)
					if err != nil || m == nil {
						t.Errorf("child: %v\n%s", err, out)
						return
					}
					n, _ := strconv.Atoi(string(m[1]))
					total += n
					outputs = append(outputs, string(m[0]))
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			if total != 1 {
				t.Fatalf("%d processes acquired %d times in all (%v), want 1", procs, total, outputs)
			}
			rec, err := s.Get(t.Context(), "race", "k")
			if err != nil || rec.Fence != 1 || rec.Status != idem.StatusProcessing {
				t.Fatalf("record after the race: %+v, %v; want processing, fence 1", rec, err)
			}
		})
	}
}

// raceChild is one process of TestRaceProcesses: 50 goroutines acquire the
// key at the agreed time; it prints how many of them acquired.
func raceChild(t *testing.T, prefix string) {
	addrs := strings.Split(os.Getenv(childAddrsVar), ",")
	var c redisstore.Client
	if len(addrs) > 1 {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	} else {
		c = redis.NewClient(&redis.Options{Addr: addrs[0], PoolSize: 64})
	}
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := strconv.ParseInt(os.Getenv(childStartVar), 10, 64)
	ctx := context.Background()
	// Warm the connection pool, so that the race is not one of dials.
	for range 10 {
		_, _ = s.Get(ctx, "warm", "k")
	}
	time.Sleep(time.Until(time.Unix(0, ns)))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		acquired int
	)
	for range 50 {
		wg.Go(func() {
			res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: "race", Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			if res.Outcome == idem.Acquired {
				mu.Lock()
				acquired++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("acquired=%d\n", acquired)
}
