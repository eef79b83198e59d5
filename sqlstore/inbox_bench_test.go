package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/throughput"
	"github.com/idemkit/idem/sqlstore"
)

// BenchmarkInboxVsBare measures messages through Inbox.HandleTx against
// the same handler without de-duplication, interleaved in one loop
// (internal/benchpair) on the same database: "bare" begins a
// transaction, runs the handler (one INSERT into the effects table) and
// commits; "handletx" does the same through the inbox, which adds the
// claim (an insert into idem_inbox) and the finish (an UPDATE of it) to
// the transaction; "bare+row" is the bare transaction with a prepared
// INSERT of a record row added by hand — what the database charges for
// the record, without the inbox's code. Every message is new. The ratio bare/handletx is the
// share of the bare rate the inbox keeps ("rate-share"); the metrics
// "*-msgs/s" are the rates of one goroutine.
//
//	go test -run '^$' -bench InboxVsBare -benchmem -count 3 ./sqlstore/
func BenchmarkInboxVsBare(b *testing.B) {
	for _, srv := range []server{sqliteServer, servers[0], servers[1]} {
		b.Run(srv.dialect.String(), func(b *testing.B) { inboxBench(b, srv) })
	}
}

func inboxBench(b *testing.B, srv server) {
	ctx := context.Background()
	var db *sql.DB
	if srv.dialect == sqlstore.SQLite {
		db = openDB(b, b.TempDir()+"/inbox.db")
	} else {
		db = srv.open(b, "")
	}
	s := newInboxStore(b, db, srv.dialect)
	effects := `CREATE TABLE IF NOT EXISTS inbox_bench_effects (message_id TEXT NOT NULL, process TEXT NOT NULL)`
	if srv.dialect == sqlstore.MySQL {
		effects = `CREATE TABLE IF NOT EXISTS inbox_bench_effects (message_id VARBINARY(255) NOT NULL, process VARBINARY(64) NOT NULL) ENGINE = InnoDB`
	}
	if _, err := db.Exec(effects); err != nil {
		b.Fatal(err)
	}
	group := randomName("bench-")
	b.Cleanup(func() {
		_, _ = db.Exec(srv.rebind(`DELETE FROM idem_inbox WHERE consumer_group = ?`), group)
		_, _ = db.Exec(`DROP TABLE inbox_bench_effects`)
	})
	in, err := inbox.New(s, &inbox.Config{Group: group})
	if err != nil {
		b.Fatal(err)
	}
	insert, err := db.Prepare(srv.rebind(`INSERT INTO inbox_bench_effects (message_id, process) VALUES (?, ?)`))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = insert.Close() })
	handler := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, err := tx.StmtContext(ctx, insert).ExecContext(ctx, d.ID, "bench")
		return err
	}
	record, err := db.Prepare(srv.rebind(`INSERT INTO idem_inbox (message_id, consumer_group, status, attempts, fence, lease_until, last_error, created_at, updated_at) VALUES (?, ?, 'succeeded', 1, 1, 0, '', 0, 0)`))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = record.Close() })
	var id string
	next := func() { id = fmt.Sprintf("%s-%d", group, throughput.Next()) }
	m := benchpair.Run(b,
		benchpair.Func{Name: "bare", Before: next, F: func() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := handler(ctx, tx, inbox.Delivery{Message: inbox.Message{ID: id}}); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{Name: "bare+row", Before: next, F: func() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.StmtContext(ctx, record).ExecContext(ctx, id, group); err != nil {
				b.Fatal(err)
			}
			if err := handler(ctx, tx, inbox.Delivery{Message: inbox.Message{ID: id}}); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}},
		benchpair.Func{Name: "handletx", Before: next, F: func() {
			o, err := in.HandleTx(ctx, db, inbox.Message{ID: id}, handler)
			if err != nil || o.Result != inbox.Processed {
				b.Fatalf("HandleTx = %+v, %v", o, err)
			}
		}})
	b.ReportMetric(1e9/m[0], "bare-msgs/s")
	b.ReportMetric(1e9/m[2], "handletx-msgs/s")
	b.ReportMetric(m[0]/m[2], "rate-share")
}
