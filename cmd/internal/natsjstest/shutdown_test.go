package natsjstest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/sqlstore"
)

// Messages held in a store outage for several AckWaits are not
// redelivered meanwhile (the loop's heartbeat); a shutdown in the middle
// of the outage hands them back (Run returns, with Workers > 1), and a
// consumer started after the outage has each one's effect once, none
// dead-lettered.
func TestShutdownDuringStoreOutage(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	db, _, in := sqliteInbox(t, inbox.Config{})
	var down atomic.Bool
	down.Store(true)
	var storeErrors atomic.Int32
	tx := natsjs.HandleTx(in, db, effect(sqlstore.SQLite, "p"))
	p := func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		if down.Load() {
			storeErrors.Add(1)
			return inbox.Outcome{}, errors.New("database down")
		}
		return tx(ctx, m)
	}
	var rec recorder
	cfg := natsjs.Config{Observe: rec.observe, Workers: 3, MaxDeliver: 2, AckWait: time.Second,
		Backoff: func(int) time.Duration { return 50 * time.Millisecond }}
	c := newConsumer(t, e, p, cfg)
	stop := run(t, c)
	for i := range 3 {
		e.publish(t, "x", fmt.Sprint("m-", i), "{}")
	}
	obstest.WaitFor(t, "store errors", func() bool { return storeErrors.Load() >= 30 })
	held := time.Now()
	obstest.WaitFor(t, "three AckWaits", func() bool { return time.Since(held) > 3*time.Second })
	info, err := c.JetStreamConsumer().Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.NumAckPending != 3 {
		t.Fatalf("held in the outage: %d redelivered, %d pending; want 0 and 3", info.NumRedelivered, info.NumAckPending)
	}
	stop() // Run must return while the store is still down
	rec.mu.Lock()
	n := len(rec.evs)
	for _, ev := range rec.evs {
		if ev.Action != natsjs.Naked {
			t.Errorf("stopped in the outage: %+v", ev)
		}
	}
	rec.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d deliveries settled at the stop, want 3 (naked)", n)
	}
	down.Store(false)
	var rec2 recorder
	cfg.Observe = rec2.observe
	c2 := newConsumer(t, e, p, cfg)
	run(t, c2)
	obstest.WaitFor(t, "the effects", func() bool { all, _ := effects(t, db, sqlstore.SQLite, ""); return all == 3 && settled(t, c2) })
	for i := range 3 {
		if _, of := effects(t, db, sqlstore.SQLite, fmt.Sprint("m-", i)); of != 1 {
			t.Fatalf("m-%d: %d effects", i, of)
		}
	}
	if n := e.streamMsgs(t, e.dead); n != 0 {
		t.Fatalf("%d dead letters after the outage", n)
	}
}
