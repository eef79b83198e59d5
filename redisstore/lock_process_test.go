package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/lock"
	"github.com/idemkit/idem/redisstore"
)

// Environment of a TestLockMultiProcess child.
const (
	lockChildPrefixVar = "REDISSTORE_TEST_LOCK_CHILD_PREFIX"
	lockChildAddrVar   = "REDISSTORE_TEST_LOCK_CHILD_ADDR"
	lockChildStartVar  = "REDISSTORE_TEST_LOCK_CHILD_START" // unix milliseconds
)

const (
	lockProcesses  = 3
	lockGoroutines = 4
	lockRounds     = 5
)

// counterScript is the protected resource's write: it bumps the counter
// only for a fence above the last one it accepted (the Redis form of
// UPDATE … WHERE last_fence < ?). KEYS[1]: the counter hash. ARGV: fence.
var counterScript = redis.NewScript(`
local last = tonumber(redis.call('HGET', KEYS[1], 'last') or '0')
if last >= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'last', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'n', 1)
return 1`)

func lockResourceKeys(prefix string) (logKey, counterKey string) {
	return prefix + ":res:{r}:log", prefix + ":res:{r}:counter"
}

// TestLockMultiProcess re-executes the test binary: 3 processes × 4
// goroutines each acquire one lock name 5 times with a Locker over the
// LockBackend. Inside its critical section each holder appends
// "fence owner" to a list and bumps a counter that refuses a fence not
// above the last one. Then: one list entry and one counted write per
// acquisition, fences strictly increasing in the list's order (the order
// of acquisition, if the lock excludes).
func TestLockMultiProcess(t *testing.T) {
	if prefix := os.Getenv(lockChildPrefixVar); prefix != "" {
		lockChild(t, prefix)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	c := singleClient(t)
	prefix := randomPrefix()
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	start := time.Now().Add(time.Second)
	type child struct {
		cmd            *exec.Cmd
		stdout, stderr bytes.Buffer
	}
	var children []*child
	for range lockProcesses {
		ch := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestLockMultiProcess$", "-test.count=1")}
		ch.cmd.Env = append(os.Environ(), lockChildPrefixVar+"="+prefix, lockChildAddrVar+"="+c.Options().Addr,
			lockChildStartVar+"="+strconv.FormatInt(start.UnixMilli(), 10))
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.stdout, &ch.stderr
		setDeathSignal(ch.cmd)
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, ch)
	}
	for i, ch := range children {
		if err := ch.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\nstdout:\n%s\nstderr:\n%s", i, err, ch.stdout.String(), ch.stderr.String())
		}
	}
	ctx := t.Context()
	logKey, counterKey := lockResourceKeys(prefix)
	entries, err := c.LRange(ctx, logKey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	const want = lockProcesses * lockGoroutines * lockRounds
	var last int64
	owners := map[string]bool{}
	for i, e := range entries {
		f, owner, _ := strings.Cut(e, " ")
		fence, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("entry %q: %v", e, err)
		}
		if fence <= last {
			t.Errorf("entry %d: fence %d after %d: not strictly increasing in acquisition order", i, fence, last)
		}
		if owners[owner] {
			t.Errorf("owner %s logged twice", owner)
		}
		owners[owner], last = true, fence
	}
	n, _ := c.HGet(ctx, counterKey, "n").Int64()
	lastFence, _ := c.HGet(ctx, counterKey, "last").Int64()
	if len(entries) != want || n != want || lastFence != last {
		t.Fatalf("%d log entries, counter %d (last fence %d, log's last %d); want %d acquisitions", len(entries), n, lastFence, last, want)
	}
	t.Logf("%d processes × %d goroutines × %d rounds: %d acquisitions, fences up to %d", lockProcesses, lockGoroutines, lockRounds, n, last)
}

func lockChild(t *testing.T, prefix string) {
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(lockChildAddrVar), PoolSize: lockGoroutines + 1})
	defer c.Close()
	b, err := redisstore.NewLockBackend(c, &redisstore.LockConfig{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lock.New(b, &lock.Config{TTL: 10 * time.Second, RetryMin: 2 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	startMS, err := strconv.ParseInt(os.Getenv(lockChildStartVar), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logKey, counterKey := lockResourceKeys(prefix)
	time.Sleep(time.Until(time.UnixMilli(startMS)))
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for range lockGoroutines {
		wg.Go(func() {
			for range lockRounds {
				lease, err := l.Acquire(ctx, "contended")
				if err != nil {
					fail(err)
					return
				}
				if err := c.RPush(ctx, logKey, fmt.Sprintf("%d %s", lease.Fence(), lease.Owner())).Err(); err != nil {
					fail(err)
				}
				if ok, err := counterScript.Run(ctx, c, []string{counterKey}, lease.Fence()).Int64(); err != nil || ok != 1 {
					fail(fmt.Errorf("counter refused fence %d: %v", lease.Fence(), err))
				}
				if err := lease.Release(ctx); err != nil {
					fail(fmt.Errorf("release fence %d: %w", lease.Fence(), err))
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
}
