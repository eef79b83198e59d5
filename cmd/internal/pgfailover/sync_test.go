//go:build linux

package pgfailover

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// roundsVar sets the number of failovers of TestSyncFailover.
const roundsVar = "IDEM_FAILOVER_ROUNDS"

const (
	workers  = 16  // pairs of clients, each pair sending one key at a time
	perPhase = 200 // keys answered before each failover, and after the last
	keyWait  = 2 * time.Minute
)

func failoverRounds(t *testing.T) int {
	t.Helper()
	v := os.Getenv(roundsVar)
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number of failovers", roundsVar, v)
	}
	return n
}

// load is workers pairs of clients, each pair sending fresh keys one
// after another, both clients of a pair the same key at once, retrying
// it until it is answered, until stopped.
type load struct {
	t    *testing.T
	rg   *rig
	ty   tally
	next atomic.Int64 // keys handed out
	stop atomic.Bool
	wg   sync.WaitGroup
	// ctx ends when the test does: a client whose key is still unanswered
	// then gives up rather than hold the test's end for keyWait.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	answers  map[string]reply
	answered map[int64]time.Time // key number → when it was answered
}

func keyName(i int64) string { return fmt.Sprintf("k-%06d", i) }

func startLoad(t *testing.T, rg *rig) *load {
	l := &load{t: t, rg: rg, answers: map[string]reply{}, answered: map[int64]time.Time{}}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for !l.stop.Load() {
				i := l.next.Add(1)
				key := keyName(i)
				// Two clients send the key at once (a user's double
				// click, a timed-out retry): both get the same answer.
				ctx, cancel := context.WithTimeout(l.ctx, keyWait)
				var twin reply
				var twinErr error
				twinDone := make(chan struct{})
				go func() {
					defer close(twinDone)
					twin, twinErr = rg.untilAnswered(ctx, key, &l.ty)
				}()
				rp, err := rg.untilAnswered(ctx, key, &l.ty)
				<-twinDone
				cancel()
				if err := errors.Join(err, twinErr); err != nil {
					if l.ctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				if rp.status != twin.status || rp.body != twin.body {
					t.Errorf("key %s: one client got %d %s, the other %d %s", key, rp.status, rp.body, twin.status, twin.body)
				}
				l.mu.Lock()
				l.answers[key] = rp
				l.answered[i] = time.Now()
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() {
		l.cancel()
		l.halt()
	})
	return l
}

// halt stops the clients once each has its current key answered.
func (l *load) halt() {
	l.stop.Store(true)
	l.wg.Wait()
}

func (l *load) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answers)
}

// waitAnswered waits until n keys are answered in all.
func (l *load) waitAnswered(n int) {
	l.t.Helper()
	deadline := time.Now().Add(keyWait)
	for l.count() < n {
		if l.t.Failed() || time.Now().After(deadline) {
			l.t.Fatalf("%d keys answered, waiting for %d: %s", l.count(), n, &l.ty)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// firstAfter returns when the first key handed out after key number i was
// answered: a request that ran on the new primary.
func (l *load) firstAfter(i int64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for k, at := range l.answered {
		if k > i && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first
}

// TestSyncFailover kills the primary of a synchronous pair under load and
// promotes its replica, IDEM_FAILOVER_ROUNDS times (back and forth: the
// old primary is rebuilt as the new one's synchronous replica). Every key
// a client was answered 2xx for has exactly one effect row on the last
// primary, no key has two, and a replay answers what the client got.
func TestSyncFailover(t *testing.T) {
	t.Parallel()
	rounds := failoverRounds(t)
	start := time.Now()
	c, primary, replica := syncPair(t)
	rg := newRig(t, c.url())
	setup := time.Since(start)

	l := startLoad(t, rg)
	var promoteTimes, recoveryTimes []time.Duration
	for round := 1; round <= rounds; round++ {
		l.waitAnswered(l.count() + perPhase)
		primary.kill()
		killed := time.Now()    // every process of it is dead
		handed := l.next.Load() // keys after this one run on the new primary
		replica.promote()
		promoteTimes = append(promoteTimes, time.Since(killed))
		old := primary
		primary, replica = replica, nil
		l.waitAnswered(l.count() + workers + 1) // at most workers keys were in flight at the kill
		recoveryTimes = append(recoveryTimes, l.firstAfter(handed).Sub(killed))
		t.Logf("failover %d: %s killed, %s promoted in %v; first new key answered %v after the kill",
			round, old.name, primary.name, promoteTimes[round-1].Round(time.Millisecond), recoveryTimes[round-1].Round(time.Millisecond))
		if round < rounds {
			replica = c.startReplica(old.slot, primary.addr())
			c.attachSync(primary, replica)
		}
	}
	l.waitAnswered(l.count() + perPhase)
	l.halt()
	loadTime := time.Since(start) - setup

	// On the last primary: one effect row per answered key, the one its
	// answer names; no row of a key never answered.
	rows := effects(t, primary)
	total, doubled, lost := 0, 0, 0
	for key, ids := range rows {
		total += len(ids)
		if len(ids) > 1 {
			doubled++
			t.Errorf("key %s: %d effect rows %v, want 1", key, len(ids), ids)
		}
		if _, ok := l.answers[key]; !ok {
			t.Errorf("key %s: effect rows %v, but no client was answered", key, ids)
		}
	}
	for key, rp := range l.answers {
		ids := rows[key]
		if len(ids) == 0 {
			lost++
			t.Errorf("key %s: answered %d %s, but no effect row on the promoted server", key, rp.status, rp.body)
		} else if want := effectOf(t, rp.body); ids[0] != want {
			t.Errorf("key %s: answered effect %d, but the row is %d", key, want, ids[0])
		}
	}
	if total != len(l.answers) {
		t.Errorf("%d effect rows for %d keys answered", total, len(l.answers))
	}

	// A replay of every key answers what its client got, without running
	// the handler.
	runs := rg.executions()
	var replayed atomic.Int64
	keys := make(chan string)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range keys {
				rp, err := rg.post(context.Background(), key)
				switch want := l.answers[key]; {
				case err != nil:
					t.Errorf("replay of %s: %v", key, err)
				case rp.status != want.status || rp.body != want.body || !rp.replayed:
					t.Errorf("replay of %s: %d %s (replayed %v), but its client got %d %s", key, rp.status, rp.body, rp.replayed, want.status, want.body)
				default:
					replayed.Add(1)
				}
			}
		}()
	}
	for key := range l.answers {
		keys <- key
	}
	close(keys)
	wg.Wait()
	if after := rg.executions(); after != runs {
		t.Errorf("the replays ran the handler %d times", after-runs)
	}

	// The kills hit requests in flight, and some commits whose outcome
	// their handler never learnt may have survived on the promoted server:
	// their keys replay the answer the handler could not send.
	rg.mu.Lock()
	unsure := maps.Clone(rg.unsure)
	rg.mu.Unlock()
	reruns, survived := 0, 0
	for key, rp := range l.answers {
		reruns += rg.ran(key) - 1
		if slices.Contains(unsure[key], effectOf(t, rp.body)) {
			survived++
		}
	}
	if l.ty.failures() == 0 {
		t.Errorf("no request failed with the server: the kills hit none in flight")
	}
	t.Logf("%d failovers; %d keys answered, %d effect rows, %d doubled, %d lost, %d of %d replays equal to the first answer",
		rounds, len(l.answers), total, doubled, lost, replayed.Load(), len(l.answers))
	t.Logf("clients: %s; handler: %d executions, %d failed with the server (%d at the commit, of which %d committed all the same), %d extra executions of answered keys",
		&l.ty, runs, rg.failed.Load(), len(unsure), survived, reruns)
	t.Logf("times: setup %v, load %v, promotions %v, kill to first new key answered %v",
		setup.Round(time.Millisecond), loadTime.Round(time.Millisecond), promoteTimes, recoveryTimes)
}
