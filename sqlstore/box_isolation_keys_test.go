package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// isolationDefault is a database of the *UnderIsolationDefault tests.
type isolationDefault struct {
	name    string
	dialect sqlstore.Dialect
	open    func(t *testing.T) *sql.DB
	// wrapped: the store's own statements run in READ COMMITTED
	// transactions of their own; otherwise alone.
	wrapped bool
}

// isolationDefaults: PostgreSQL and MariaDB whose sessions default to
// each level.
var isolationDefaults = []isolationDefault{
	{"postgres/read committed", sqlstore.PostgreSQL, pgAt("read committed"), false},
	{"postgres/repeatable read", sqlstore.PostgreSQL, pgAt("repeatable read"), true},
	{"postgres/serializable", sqlstore.PostgreSQL, pgAt("serializable"), true},
	{"mysql/READ-COMMITTED", sqlstore.MySQL, myAt("READ-COMMITTED"), false},
	{"mysql/REPEATABLE-READ", sqlstore.MySQL, myAt("REPEATABLE-READ"), false},
	{"mysql/SERIALIZABLE", sqlstore.MySQL, myAt("SERIALIZABLE"), false},
}

func checkWrapped(t *testing.T, rc, known, want bool) {
	t.Helper()
	if !known || rc != want {
		t.Fatalf("own statements in READ COMMITTED transactions = %v (known %v), want %v", rc, known, want)
	}
}

// concurrently runs workers goroutines, all at once, that each call f
// for i in [0, per), and fails t with every error f returned (what names
// the per×workers calls).
func concurrently(t *testing.T, workers, per int, what string, f func(w, i int) error) {
	t.Helper()
	errs := make(chan error, workers*per)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range per {
				if err := f(w, i); err != nil {
					errs <- err
				}
			}
		})
	}
	close(start)
	wg.Wait()
	failures(t, errs, workers*per, what)
}

// failures collects the errors of concurrent workers and fails t with
// all of them.
func failures(t *testing.T, errs chan error, total int, what string) {
	t.Helper()
	close(errs)
	var failed []string
	for err := range errs {
		failed = append(failed, err.Error())
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d %s failed:\n%s", len(failed), total, what, strings.Join(failed, "\n"))
	}
}

// TestInboxDistinctMessagesUnderIsolationDefault: the InboxStore's own
// statements and its own claim transaction on distinct messages never
// fail each other, whatever isolation the sessions default to (as
// TestDistinctKeysUnderIsolationDefault for the Store). Many goroutines
// each claim (an insert), fail, claim again (the locking read and update
// of the claim's own transaction), extend and finish messages of their
// own on a fresh idem_inbox; every call succeeds, and every record ends
// succeeded at its second attempt.
func TestInboxDistinctMessagesUnderIsolationDefault(t *testing.T) {
	for _, c := range isolationDefaults {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newInboxStore(t, c.open(t), c.dialect)
			ctx := t.Context()
			const workers, per, group = 24, 8, "g"
			concurrently(t, workers, per, "distinct messages", func(w, i int) error {
				id := fmt.Sprintf("m-%02d-%02d", w, i)
				if err := claimFailFinish(ctx, s, group, id); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				return nil
			})
			for w := range workers {
				for i := range per {
					id := fmt.Sprintf("m-%02d-%02d", w, i)
					r, err := s.Get(ctx, group, id)
					if err != nil || r.Status != inbox.StatusSucceeded || r.Attempts != 2 || r.Fence != 2 {
						t.Fatalf("record %s = %+v, %v; want succeeded at attempt 2, fence 2", id, r, err)
					}
				}
			}
			rc, known := sqlstore.InboxOwnStatementsInReadCommitted(s)
			checkWrapped(t, rc, known, c.wrapped)
		})
	}
}

func claimFailFinish(ctx context.Context, s *sqlstore.InboxStore, group, id string) error {
	c, err := s.Claim(ctx, group, id, time.Minute, 5)
	if err != nil || !c.Claimed {
		return fmt.Errorf("first claim: %+v, %w", c, err)
	}
	if _, err := s.Fail(ctx, group, id, c.Fence, 5, "first"); err != nil {
		return fmt.Errorf("Fail: %w", err)
	}
	if c, err = s.Claim(ctx, group, id, time.Minute, 5); err != nil || !c.Claimed {
		return fmt.Errorf("second claim: %+v, %w", c, err)
	}
	if err := s.Extend(ctx, group, id, c.Fence, time.Minute); err != nil {
		return fmt.Errorf("Extend: %w", err)
	}
	if err := s.Finish(ctx, group, id, c.Fence); err != nil {
		return fmt.Errorf("Finish: %w", err)
	}
	return nil
}

// TestOutboxDistinctRowsUnderIsolationDefault: while writers add many
// messages (each in a transaction of its own, at the sessions' default
// isolation), relays publish them, and the relays' claims, marks and
// sweeps, and the backlog's count, never fail each other on distinct
// rows, whatever isolation the sessions default to. Every message is
// published exactly once and ends sent; no call fails.
func TestOutboxDistinctRowsUnderIsolationDefault(t *testing.T) {
	for _, c := range isolationDefaults {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := c.open(t)
			s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: c.dialect})
			ctx := t.Context()
			const writers, per, relays = 16, 12, 4
			var (
				mu        sync.Mutex
				published = map[string]int{}
				added     = map[string]bool{}
			)
			p := outbox.PublisherFunc(func(_ context.Context, m outbox.Message) error {
				mu.Lock()
				published[m.ID]++
				mu.Unlock()
				return nil
			})
			r, err := outbox.NewRelay(s, p, &outbox.RelayConfig{BatchSize: 10})
			if err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, writers*per+relays*1000)
			start := make(chan struct{})
			var (
				wg, wwg sync.WaitGroup
				writing atomic.Bool
			)
			writing.Store(true)
			for w := range writers {
				wwg.Go(func() {
					<-start
					for i := range per {
						ids, err := addTx(ctx, db, s, false, outbox.Message{Topic: "t", Key: fmt.Sprintf("k-%02d", w), Payload: []byte(fmt.Sprint(i))})
						if err != nil {
							errs <- fmt.Errorf("add %d/%d: %w", w, i, err)
							continue
						}
						mu.Lock()
						added[ids[0]] = true
						mu.Unlock()
					}
				})
			}
			for range relays {
				wg.Go(func() {
					<-start
					for {
						more := writing.Load() // read before the claim: a last cycle after the writers ended
						n, err := r.Once(ctx)
						if err != nil {
							errs <- fmt.Errorf("relay: %w", err)
							return
						}
						if _, err := s.Sweep(ctx, 0, 5); err != nil {
							errs <- fmt.Errorf("sweep: %w", err)
							return
						}
						if _, err := s.Backlog(ctx); err != nil {
							errs <- fmt.Errorf("backlog: %w", err)
							return
						}
						if n == 0 && !more {
							return
						}
					}
				})
			}
			close(start)
			wwg.Wait()
			writing.Store(false)
			wg.Wait()
			failures(t, errs, writers*per, "adds, relay cycles, sweeps and backlogs (counted as messages)")
			// Rows locked by another relay's batch are skipped: publish
			// what is left, alone.
			for {
				n, err := r.Once(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
			}
			if len(added) != writers*per {
				t.Fatalf("%d messages added, want %d", len(added), writers*per)
			}
			for id := range added {
				if published[id] != 1 {
					t.Errorf("message %s published %d times, want 1", id, published[id])
				}
			}
			if len(published) != len(added) {
				t.Errorf("%d messages published, %d added", len(published), len(added))
			}
			if b, err := s.Backlog(ctx); err != nil || b.Pending != 0 {
				t.Fatalf("backlog %+v, %v; want none pending", b, err)
			}
			rc, known := sqlstore.OutboxOwnStatementsInReadCommitted(s)
			checkWrapped(t, rc, known, c.wrapped)
		})
	}
}
