package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// BenchmarkOutboxVsBare measures the outbox against the bare statements
// it runs, interleaved in one loop (internal/benchpair) on one database
// of its own per dialect:
//
//   - add: BEGIN, OutboxStore.Add of a 64-byte message with a header,
//     COMMIT — against BEGIN, the bare INSERT into idem_outbox, COMMIT;
//
//   - relay: one message added (untimed, in Before) and Relay.Once, which
//     claims it, hands it to an in-memory publisher and marks it sent —
//     against the bare claim transaction: BEGIN, SELECT … LIMIT 1 FOR
//     UPDATE SKIP LOCKED (no lock clause on SQLite), UPDATE … SET sent_at,
//     COMMIT;
//
//   - relay100: 100 messages of 100 keys added (untimed) and one
//     Relay.Once that publishes and marks them all — against BEGIN, the
//     claim SELECT of 100 rows, 100 UPDATEs by id, COMMIT.
//
//     go test -run '^$' -bench OutboxVsBare -benchmem -count 3 ./sqlstore/
func BenchmarkOutboxVsBare(b *testing.B) {
	for _, srv := range []server{sqliteServer, servers[0], servers[1]} {
		b.Run(srv.dialect.String(), func(b *testing.B) {
			for _, op := range []string{"add", "relay", "relay100"} {
				b.Run(op, func(b *testing.B) { outboxBench(b, srv, op) })
			}
		})
	}
}

func outboxBench(b *testing.B, srv server, op string) {
	ctx := context.Background()
	var db *sql.DB
	switch srv.dialect {
	case sqlstore.SQLite:
		db = openDB(b, b.TempDir()+"/outbox.db")
	case sqlstore.PostgreSQL:
		db, _ = testdb.Postgres(b)
	default:
		db, _ = testdb.MySQL(b)
	}
	s := newOutboxStore(b, db, sqlstore.OutboxConfig{Dialect: srv.dialect})
	b.Cleanup(func() { _, _ = db.ExecContext(context.Background(), `DELETE FROM idem_outbox`) })
	payload := make([]byte, 64)
	msg := outbox.Message{Topic: "order.paid", Key: "order-1", Payload: payload, Headers: map[string]string{"content-type": "application/json"}}
	insert := srv.rebind(`INSERT INTO idem_outbox (topic, msg_key, payload, headers, created_at) VALUES (?, ?, ?, ?, 0)`)
	lockClause := " FOR UPDATE SKIP LOCKED"
	if srv.dialect == sqlstore.SQLite {
		lockClause = ""
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	add := func(n int) {
		tx, err := db.BeginTx(ctx, nil)
		must(err)
		for i := range n {
			m := msg
			m.Key = fmt.Sprintf("order-%d", i)
			_, err := s.Add(ctx, tx, m)
			must(err)
		}
		must(tx.Commit())
	}
	pub := outbox.PublisherFunc(func(context.Context, outbox.Message) error { return nil })
	r, err := outbox.NewRelay(s, pub, &outbox.RelayConfig{BatchSize: 100, Retention: -1})
	must(err)
	once := func(want int) func() {
		return func() {
			n, err := r.Once(ctx)
			must(err)
			if n != want {
				b.Fatalf("Once published %d, want %d", n, want)
			}
		}
	}
	bareClaim := func(limit int) func() {
		q := srv.rebind(`SELECT id, topic, msg_key, payload, headers, created_at FROM idem_outbox WHERE sent_at IS NULL ORDER BY id LIMIT ?` + lockClause)
		upd := srv.rebind(`UPDATE idem_outbox SET sent_at = 1 WHERE id = ?`)
		return func() {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			must(err)
			rows, err := tx.QueryContext(ctx, q, limit)
			must(err)
			var ids []int64
			for rows.Next() {
				var (
					id, created int64
					topic, key  string
					p           []byte
					h           sql.NullString
				)
				must(rows.Scan(&id, &topic, &key, &p, &h, &created))
				ids = append(ids, id)
			}
			must(rows.Err())
			if len(ids) != limit {
				b.Fatalf("bare claim read %d rows, want %d", len(ids), limit)
			}
			for _, id := range ids {
				_, err := tx.ExecContext(ctx, upd, id)
				must(err)
			}
			must(tx.Commit())
		}
	}
	var fns []benchpair.Func
	switch op {
	case "add":
		fns = []benchpair.Func{
			{Name: "add", F: func() { add(1) }},
			{Name: "bare-insert", F: func() {
				tx, err := db.BeginTx(ctx, nil)
				must(err)
				_, err = tx.ExecContext(ctx, insert, msg.Topic, msg.Key, payload, `{"content-type":"application/json"}`)
				must(err)
				must(tx.Commit())
			}},
		}
	case "relay":
		fns = []benchpair.Func{
			{Name: "relay", Before: func() { add(1) }, F: once(1)},
			{Name: "bare-claim", Before: func() { add(1) }, F: bareClaim(1)},
		}
	case "relay100":
		fns = []benchpair.Func{
			{Name: "relay100", Before: func() { add(100) }, F: once(100)},
			{Name: "bare-claim100", Before: func() { add(100) }, F: bareClaim(100)},
		}
	}
	ns := benchpair.Run(b, fns...)
	b.ReportMetric(ns[0]/ns[1], "ratio")
	if op == "relay100" {
		b.ReportMetric(100e9/ns[0], "msgs/s")
	}
	// The add case leaves rows pending: the next case starts empty.
	_, _ = db.ExecContext(ctx, `DELETE FROM idem_outbox`)
}
