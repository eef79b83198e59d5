package shop_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// idsOf reads the first column of q's rows, in order.
func idsOf(t *testing.T, db *sql.DB, q string) []string {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// eventID is the message ID of the outbox row whose id is row (in
// decimal): what the relay publishes it with and the consumer records.
func eventID(t *testing.T, db *sql.DB, row string) string {
	t.Helper()
	ids := idsOf(t, db, `SELECT msg_id FROM idem_outbox WHERE id = `+row)
	if len(ids) != 1 {
		t.Fatalf("outbox row %s: message IDs %q", row, ids)
	}
	return ids[0]
}

// The close job's pass sweeps the sent events (idem_outbox) and the
// loyalty consumer's finished records (idem_inbox) older than the
// retention, by the rows' sent_at and updated_at, and keeps the newer
// ones and every pending event however old; with a negative retention it
// sweeps nothing.
func TestCloseJobSweepsOldEventsAndConsumeRecords(t *testing.T) {
	forBackends(t, testCloseJobSweeps)
}

func testCloseJobSweeps(t *testing.T, b backend) {
	s, db := newShop(t, b)
	// Four cancelled orders: four order.cancelled events, relayed to the
	// loyalty consumer (which succeeds without a ledger row): four sent
	// rows, four succeeded records. A fifth event stays pending.
	for user := range int64(5) {
		o := placeOrder(t, s, user+1, 1)
		if code, _, problem := cancel(t, s, user+1, o.OrderNo); code != 200 {
			t.Fatalf("cancel: %d %s", code, problem)
		}
		if user == 3 {
			deliverAll(t, s, db, b.dialect, 1)
		}
	}
	rows := idsOf(t, db, `SELECT id FROM idem_outbox ORDER BY id`)
	if len(rows) != 5 || payCount(t, db, b, `SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL`) != 1 ||
		payCount(t, db, b, `SELECT COUNT(*) FROM idem_inbox WHERE status = 'succeeded'`) != 4 {
		t.Fatalf("outbox rows %v; want 5 (4 sent, 1 pending) and 4 succeeded consume records", rows)
	}
	msgID := func(row string) string { return eventID(t, db, row) }
	const day = 24 * 60 * 60 * 1000
	// Rows 1 and 2 sent, and their records finished, 8 days ago; row 3
	// 6 days ago (kept); row 4 now; the pending row 5 written 30 days ago.
	for _, c := range []struct {
		row  string
		days int
	}{{rows[0], 8}, {rows[1], 8}, {rows[2], 6}} {
		mustExec(t, db, fmt.Sprintf(`UPDATE idem_outbox SET sent_at = sent_at - %d WHERE id = %s`, c.days*day, c.row))
		mustExec(t, db, fmt.Sprintf(`UPDATE idem_inbox SET updated_at = updated_at - %d WHERE message_id = '%s'`, c.days*day, msgID(c.row)))
	}
	mustExec(t, db, fmt.Sprintf(`UPDATE idem_outbox SET created_at = created_at - %d WHERE id = %s`, 30*day, rows[4]))

	// A negative retention keeps everything.
	keep, err := s.NewCloser(&shop.CloserConfig{Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	if _, err := keep.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := idsOf(t, db, `SELECT id FROM idem_outbox ORDER BY id`); !slices.Equal(got, rows) {
		t.Fatalf("outbox rows %v after a pass that keeps everything, want %v", got, rows)
	}

	// The default retention, a week.
	c, err := s.NewCloser(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := idsOf(t, db, `SELECT id FROM idem_outbox ORDER BY id`), rows[2:]; !slices.Equal(got, want) {
		t.Errorf("outbox rows %v after the sweep, want %v (the two sent 8 days ago gone)", got, want)
	}
	if n := payCount(t, db, b, `SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL AND id = `+rows[4]); n != 1 {
		t.Errorf("the old pending event was swept")
	}
	got := idsOf(t, db, `SELECT message_id FROM idem_inbox ORDER BY message_id`)
	want := []string{msgID(rows[2]), msgID(rows[3])}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("consume records %v after the sweep, want %v", got, want)
	}
	// A second pass finds nothing more to sweep.
	if _, err := c.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := idsOf(t, db, `SELECT id FROM idem_outbox ORDER BY id`); len(got) != 3 {
		t.Errorf("outbox rows %v after a second pass, want 3", strings.Join(got, ","))
	}
}
