package redisstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/inboxtest"
	"github.com/idemkit/idem/redisstore"
)

func newInboxStore(t testing.TB, c redisstore.Client, retention time.Duration) (*redisstore.InboxStore, string) {
	t.Helper()
	prefix := randomPrefix()
	s, err := redisstore.NewInboxStore(c, &redisstore.InboxConfig{Prefix: prefix, Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	return s, prefix
}

// TestInboxConformance runs inboxtest on a server and on a cluster, where
// the records of a group are spread over the masters and Sweep walks
// each.
func TestInboxConformance(t *testing.T) {
	for _, setup := range setups {
		t.Run(setup.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newInboxStore(t, setup.client(t), 0)
			inboxtest.Run(t, func(*testing.T) inbox.Store { return s }, inboxtest.Caps{})
		})
	}
}

// Handle's mode on Redis: the same message five times and a handler that
// fails twice give one effect; the record keys carry a TTL only once the
// message is finished.
func TestInboxHandle(t *testing.T) {
	t.Parallel()
	c := singleClient(t)
	s, prefix := newInboxStore(t, c, time.Hour)
	in, err := inbox.New(s, &inbox.Config{Group: "mailer"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var sent atomic.Int64
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			for {
				o, err := in.Handle(ctx, inbox.Message{ID: "m1"}, func(context.Context, inbox.Delivery) error {
					sent.Add(1)
					time.Sleep(10 * time.Millisecond)
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				if o.Result.Ack() {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if sent.Load() != 1 {
		t.Fatalf("%d effects, want 1", sent.Load())
	}
	key := prefix + ":inbox:6:mailer:m1"
	if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("succeeded record's TTL %v, want the retention", ttl)
	}

	calls := 0
	h := func(context.Context, inbox.Delivery) error {
		calls++
		if calls <= 2 {
			return errors.New("downstream 503")
		}
		return nil
	}
	for i, want := range []inbox.Result{inbox.Retry, inbox.Retry, inbox.Processed, inbox.Duplicate} {
		o, err := in.Handle(ctx, inbox.Message{ID: "m2"}, h)
		if err != nil || o.Result != want {
			t.Fatalf("delivery %d: %+v %v", i+1, o, err)
		}
		if i == 0 {
			if ttl := c.PTTL(ctx, prefix+":inbox:6:mailer:m2").Val(); ttl != -1*time.Millisecond && ttl != -1 {
				t.Fatalf("a failed record has TTL %v, want none", ttl)
			}
		}
	}
	if calls != 3 {
		t.Fatalf("%d calls", calls)
	}
	if r, _ := s.Get(ctx, "mailer", "m2"); r.Status != inbox.StatusSucceeded || r.Attempts != 3 {
		t.Fatalf("record %+v", r)
	}
}
