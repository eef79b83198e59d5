package sentinelfail

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// roundsVar sets how many failovers TestFailoverUnderLoad makes per
// store (default 1).
const roundsVar = "IDEM_FAILOVER_ROUNDS"

const (
	keysPerRound = 300
	workers      = 24
)

// TestFailoverUnderLoad sends keysPerRound keys per round through the
// middleware from many goroutines, each key retried (same key, same body)
// until a 2xx, and SIGKILLs the primary once a third of the round's keys
// have their answer; the Sentinels promote a replica and the program
// follows it. The killed server comes back as a replica for the next
// round. At the end every key is sent once more, as a user checking would:
// it must replay the answer the client got, and every key must have
// exactly one effect row.
//
// The plain store is measured, not held to it: a completion the primary
// acknowledged but had not yet sent to a replica is lost (see
// TestAcknowledgedCompletionLost). With WaitReplicas (one of the two
// replicas) no acknowledged completion may be lost and no effect may run
// twice.
func TestFailoverUnderLoad(t *testing.T) {
	rounds := 1
	if v := os.Getenv(roundsVar); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", roundsVar, v)
		}
		rounds = n
	}
	for _, tc := range variants {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			loadRounds(t, tc.wait, rounds)
		})
	}
}

// keyLog is what the client saw for one key.
type keyLog struct {
	first    answer // the first 2xx
	attempts int
}

func loadRounds(t *testing.T, wait bool, rounds int) {
	start := time.Now()
	d := deploy(t, 2)
	a := newApp(t, d, wait, 10*time.Second)
	var (
		mu     sync.Mutex
		keys   = map[string]*keyLog{}
		counts = map[string]int{} // answers by kind
	)
	var failovers []time.Duration
	for round := range rounds {
		var done atomic.Int64
		todo := make(chan string)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for key := range todo {
					answers := a.until(t, key)
					mu.Lock()
					for _, ans := range answers {
						counts[kind(ans)]++
					}
					keys[key] = &keyLog{first: answers[len(answers)-1], attempts: len(answers)}
					mu.Unlock()
					done.Add(1)
				}
			})
		}
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			waitFor(t, "a third of the keys", func() bool { return done.Load() >= keysPerRound/3 })
			_, took := d.failover(nil)
			failovers = append(failovers, took)
		}()
		for i := range keysPerRound {
			todo <- fmt.Sprintf("r%d-k%03d", round, i)
		}
		close(todo)
		wg.Wait()
		<-killed
	}

	// The user's check: every key once more, until a 2xx.
	lost := 0
	for key, kl := range keys {
		answers := a.until(t, key)
		last := answers[len(answers)-1]
		if !last.replayed || last.body != kl.first.body {
			lost++
			t.Logf("key %s: the client got %d %q; a retry now gets %d replayed=%v %q after %d answers",
				key, kl.first.status, kl.first.body, last.status, last.replayed, last.body, len(answers))
		}
	}
	rows := a.rows(t)
	doubled, missing := 0, 0
	for key := range keys {
		switch n := rows[key]; {
		case n == 0:
			missing++
		case n > 1:
			doubled++
			t.Logf("key %s: %d effect rows", key, n)
		}
	}
	fresh, replays := 0, 0
	for _, kl := range keys {
		if kl.first.replayed {
			replays++
		} else {
			fresh++
		}
	}
	outlived := int(a.leaseLost.Load() + a.insertFailed.Load())
	t.Logf("wait=%v: %d rounds, %d keys, %d requests (%v); first 2xx: %d fresh, %d replays; failovers %v; "+
		"completion retries %d, responses not stored %d, completions refused for a lost lease %d, failed effect inserts %d; "+
		"lost completions %d, doubled effects %d, keys without an effect %d; %v",
		wait, rounds, len(keys), total(counts), counts, fresh, replays, failovers,
		a.completeRetries.Load(), a.notStored.Load(), a.leaseLost.Load(), a.insertFailed.Load(),
		lost, doubled, missing, time.Since(start).Round(time.Millisecond))
	if missing > 0 {
		t.Errorf("%d keys answered 2xx have no effect row", missing)
	}
	if wait && (lost > 0 || a.notStored.Load() > 0) {
		t.Errorf("with WaitReplicas: %d lost completions, %d responses not stored; want none", lost, a.notStored.Load())
	}
	// With WAIT on every replica, Redis takes no write while a replica is
	// missing (the killed primary is on its way back): an execution that
	// cannot renew its lease or store its completion for longer than the
	// lease loses it, and a retry runs its effect again, which is outside
	// Redis. So is an effect whose insert committed but answered an error.
	// A doubled effect is allowed for each of those, and no other
	// (docs/reliability.md, section 4).
	if wait && doubled > outlived {
		t.Errorf("with WaitReplicas: %d doubled effects, but only %d executions lost their lease or saw their effect fail", doubled, outlived)
	}
	if !wait && doubled > lost+outlived {
		t.Errorf("plain store: %d doubled effects but %d lost completions and %d executions that lost their lease or saw their effect fail: an effect ran twice without cause",
			doubled, lost, outlived)
	}
}

// kind names an answer for the counts.
func kind(a answer) string {
	switch {
	case a.err != nil:
		return "error"
	case a.replayed:
		return "replayed"
	}
	return strconv.Itoa(a.status)
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
