package adaptertest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/internal/testdb"
)

// outage is how long the database is cut off in TestDatabaseOutage: a
// failover of a managed PostgreSQL takes tens of seconds.
const outage = 60 * time.Second

// TestDatabaseOutage: the consumer's PostgreSQL is cut off for a minute
// (every connection dropped and every new one refused, or every
// connection black-holed) while a stream of
// messages flows, with the adapters' default MaxDeliver and MaxAttempts.
// Every message ends handled exactly once and none is dead-lettered: a
// store error is not a failed attempt and costs no delivery. Before, each
// store error was retried after a flat second as a new delivery, and a
// message that arrived during a 25 s outage was dead-lettered (MaxDeliver
// 20) without its handler ever running.
func TestDatabaseOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute-long outage")
	}
	t.Parallel()
	faults := []struct {
		name       string
		start, end func(*netfault.Proxy)
	}{
		// A failover: the connections reset, new ones refused.
		{"cut", func(p *netfault.Proxy) { p.Refuse(true); p.Drop() }, func(p *netfault.Proxy) { p.Refuse(false) }},
		// A network partition: nothing answers, nothing is refused.
		{"black-holed", (*netfault.Proxy).Stall, (*netfault.Proxy).Resume},
	}
	// The cases run at once, in goroutines rather than as parallel
	// subtests (which run at most GOMAXPROCS at a time): they wait most
	// of their minute, and CI pays the minute once.
	var wg sync.WaitGroup
	for _, b := range brokers {
		for _, f := range faults {
			wg.Go(func() {
				t.Run(b.name+"/"+f.name, func(t *testing.T) { outageOf(t, b.open(t), f.start, f.end) })
			})
		}
	}
	wg.Wait()
}

// outageOf runs TestDatabaseOutage's case over br, the database's
// outage starting with start and ending with end.
func outageOf(t *testing.T, br broker, start, end func(*netfault.Proxy)) {
	admin, dsn := testdb.Postgres(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := netfault.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	u.Host = proxy.Addr()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s := postgresInbox(t, db)
	if _, err := admin.Exec(`CREATE TABLE effects (message_id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(s, &inbox.Config{Group: "outage"})
	if err != nil {
		t.Fatal(err)
	}
	br.consumeDefaults(t, in.ProcessTx(db, func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, d.ID)
		return err
	}))

	const n = 200
	publish := func(from, to int, every time.Duration) {
		for i := from; i < to; i++ {
			br.publish(t, fmt.Sprint("m-", i), "{}")
			time.Sleep(every)
		}
	}
	count := func() (rows, distinct int) {
		if err := admin.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id) FROM effects`).Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		return rows, distinct
	}
	publish(0, 20, 10*time.Millisecond)
	obstest.WaitFor(t, "the first messages handled", func() bool { r, _ := count(); return r == 20 })

	start(proxy)
	cut := time.Now()
	publish(20, n-20, (outage-5*time.Second)/(n-40)) // through the outage
	time.Sleep(time.Until(cut.Add(outage)))
	if r, _ := count(); r != 20 {
		t.Fatalf("%d effects during the outage, want the 20 before it", r)
	}
	end(proxy)
	publish(n-20, n, 10*time.Millisecond)

	deadline := time.Now().Add(2 * time.Minute)
	for r, _ := count(); r < n; r, _ = count() {
		if time.Now().After(deadline) {
			t.Fatalf("%d effects of %d messages two minutes after the outage; %d dead letters", r, n, len(br.dead(t)))
		}
		time.Sleep(100 * time.Millisecond)
	}
	obstest.WaitFor(t, "the broker settled", func() bool { return br.settled(t) })
	time.Sleep(time.Second) // a late redelivery would show now
	if r, d := count(); r != n || d != n {
		t.Fatalf("%d effects of %d distinct messages, want %d of %d", r, d, n, n)
	}
	if dead := br.dead(t); len(dead) != 0 {
		t.Fatalf("%d dead letters after the outage: %v", len(dead), dead)
	}
}
