package sqlstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// TestOutboxRelaySlowBroker: the broker confirms slowly, so that
// publishing a whole batch takes longer than the batch's lease
// (OutboxConfig.Lease). The relay must still make progress — publish
// only what it can mark before the lease ends, mark it, and go on with
// the rest — instead of publishing the whole batch every cycle and
// losing every mark to the lease (ErrLeaseLost), forever.
func TestOutboxRelaySlowBroker(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _ := outboxDB(t, srv)
		s := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect, Lease: time.Second})
		const n = 12
		var msgs []outbox.Message
		for range n {
			msgs = append(msgs, outbox.Message{Topic: "t"})
		}
		if _, err := addTx(t.Context(), db, s, false, msgs...); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		published := map[string]int{}
		pub := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
			select { // a broker that confirms after 250 ms
			case <-time.After(250 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
			published[m.ID]++
			mu.Unlock()
			return nil
		})
		r, err := outbox.NewRelay(s, pub, &outbox.RelayConfig{PollInterval: 20 * time.Millisecond, RetryDelay: 20 * time.Millisecond, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- r.Run(ctx) }()
		defer func() { cancel(); <-ran }()
		deadline := time.Now().Add(60 * time.Second) // a hang guard
		for {
			var pending int
			if err := db.QueryRow(`SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&pending); err != nil {
				t.Fatal(err)
			}
			if pending == 0 {
				break
			}
			if time.Now().After(deadline) {
				mu.Lock()
				t.Fatalf("%d of %d messages still pending after 60 s; publishes: %v", pending, n, published)
			}
			time.Sleep(50 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(published) != n {
			t.Fatalf("%d messages published, want %d", len(published), n)
		}
	})
}
