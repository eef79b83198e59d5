package sqlstore_test

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// proxied returns addr (a PostgreSQL URL or a MySQL DSN) rewritten to go
// through a proxy the test controls, and the proxy.
func (srv server) proxied(t *testing.T, addr string) (string, *netfault.Proxy) {
	t.Helper()
	var (
		u   *url.URL
		cfg *mysql.Config
		err error
	)
	host := ""
	switch srv.dialect {
	case sqlstore.PostgreSQL:
		if u, err = url.Parse(addr); err == nil {
			host = u.Host
		}
	case sqlstore.MySQL:
		if cfg, err = mysql.ParseDSN(addr); err == nil {
			host = cfg.Addr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := netfault.New(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	if u != nil {
		u.Host = proxy.Addr()
		return u.String(), proxy
	}
	cfg.Addr = proxy.Addr()
	return cfg.FormatDSN(), proxy
}

// TestOutboxRelayStalledMark: the database stops answering (the network
// stalls) after the broker confirmed a batch and before the relay marked
// it. The batch is bounded by OutboxConfig.Lease: the relay stops when
// told to, instead of waiting on the mark forever (it marked under a
// context without cancellation or deadline, so Run never returned and
// the batch's rows stayed locked while the connection lived), and the
// message, never marked, is claimed again with its ID once the database
// is back.
func TestOutboxRelayStalledMark(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		db, addr := outboxDB(t, srv)
		direct := newOutboxStore(t, db, sqlstore.OutboxConfig{Dialect: srv.dialect})
		paddr, proxy := srv.proxied(t, addr)
		pdb := srv.open(t, paddr)
		s := newOutboxStore(t, pdb, sqlstore.OutboxConfig{Dialect: srv.dialect, Lease: 2 * time.Second})
		ids, err := addTx(t.Context(), db, direct, false, outbox.Message{Topic: "t", Key: "k"})
		if err != nil {
			t.Fatal(err)
		}

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var once sync.Once
		published := make(chan struct{})
		pub := outbox.PublisherFunc(func(ctx context.Context, m outbox.Message) error {
			once.Do(func() { proxy.Stall(); close(published) })
			return nil
		})
		r, err := outbox.NewRelay(s, pub, &outbox.RelayConfig{PollInterval: 20 * time.Millisecond, RetryDelay: 20 * time.Millisecond, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		ran := make(chan error, 1)
		go func() { ran <- r.Run(ctx) }()
		<-published
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(30 * time.Second):
			proxy.Resume()
			<-ran
			t.Fatal("Run did not return within 30 s of its context's end: the relay hangs on a stalled mark")
		}
		proxy.Resume()
		// The stalled session ends when its connection does: then the
		// message is pending again, under the same ID.
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := claimIDsOf(t, direct)
			if len(got) == 1 && got[0] == ids[0] {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the stall, Claim = %q, want %q pending", got, ids)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// claimIDsOf claims a batch of s, releases it and returns its IDs.
func claimIDsOf(t *testing.T, s outbox.Store) []string {
	t.Helper()
	b, err := s.Claim(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(t.Context()) //nolint:errcheck // a test's read
	var ids []string
	for _, m := range b.Messages() {
		ids = append(ids, m.ID)
	}
	return ids
}
