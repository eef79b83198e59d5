package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/sqlstore"
)

// List returns the records of one status, least recently updated first,
// of every group; Revive (and ReviveTx, when its transaction commits)
// makes a dead record failed with no attempt counted, and the next
// delivery runs the handler again.
func TestInboxListAndRevive(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _, s := inboxSetup(t, srv)
		ctx := t.Context()
		in := newSQLInbox(t, s, inbox.Config{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
		other := newSQLInbox(t, s, inbox.Config{Group: "mail", MaxAttempts: 2})
		failing := true
		h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
			if err := effect(srv, "p")(ctx, tx, d); err != nil {
				return err
			}
			if failing && d.ID != "ok-1" && d.ID != "ok-2" {
				return fmt.Errorf("cannot handle %s", d.ID)
			}
			return nil
		}
		deliver := func(in *inbox.Inbox, id string, want inbox.Result) {
			t.Helper()
			o, err := in.HandleTx(ctx, db, inbox.Message{ID: id}, h)
			if err != nil || o.Result != want {
				t.Fatalf("deliver %s: %+v, %v; want %v", id, o, err, want)
			}
		}
		// Records are listed in updated_at order, to the millisecond:
		// space the writes so that the order is theirs.
		tick := func() { time.Sleep(3 * time.Millisecond) }
		deliver(in, "ok-1", inbox.Processed)
		tick()
		deliver(in, "dead-1", inbox.Retry)
		tick()
		deliver(in, "dead-1", inbox.Dead)
		tick()
		deliver(other, "dead-2", inbox.Retry)
		tick()
		deliver(other, "dead-2", inbox.Dead)
		tick()
		deliver(in, "failed-1", inbox.Retry)
		tick()
		deliver(in, "ok-2", inbox.Processed)
		if _, err := s.Claim(ctx, "loyalty", "held-1", time.Minute, 2); err != nil {
			t.Fatal(err)
		}

		list := func(st inbox.Status, limit int) string {
			t.Helper()
			recs, err := s.List(ctx, st, limit)
			if err != nil {
				t.Fatalf("List(%s): %v", st, err)
			}
			var out []string
			for _, r := range recs {
				if r.Status != st {
					t.Fatalf("List(%s) returned %+v", st, r)
				}
				out = append(out, fmt.Sprintf("%s/%s:%d", r.Group, r.ID, r.Attempts))
			}
			return fmt.Sprint(out)
		}
		for _, c := range []struct {
			status inbox.Status
			limit  int
			want   string
		}{
			{inbox.StatusSucceeded, 0, "[loyalty/ok-1:1 loyalty/ok-2:1]"},
			{inbox.StatusDead, 0, "[loyalty/dead-1:2 mail/dead-2:2]"},
			{inbox.StatusDead, 1, "[loyalty/dead-1:2]"},
			{inbox.StatusFailed, 0, "[loyalty/failed-1:1]"},
			{inbox.StatusProcessing, 0, "[loyalty/held-1:1]"},
		} {
			if got := list(c.status, c.limit); got != c.want {
				t.Errorf("List(%s, %d) = %s, want %s", c.status, c.limit, got, c.want)
			}
		}
		recs, err := s.List(ctx, inbox.StatusDead, 1)
		if err != nil || len(recs) != 1 {
			t.Fatal(recs, err)
		}
		if r := recs[0]; r.LastError != "cannot handle dead-1" || r.Fence != 2 || r.CreatedAt.IsZero() || r.UpdatedAt.Before(r.CreatedAt) {
			t.Fatalf("dead record %+v", r)
		}
		if _, err := s.List(ctx, "", 0); err == nil {
			t.Fatal("List of no status: no error")
		}

		// Revive: only a dead record, of its group.
		for _, c := range []struct{ group, id string }{
			{"loyalty", "ok-1"}, {"loyalty", "failed-1"}, {"loyalty", "held-1"}, {"loyalty", "dead-2"}, {"loyalty", "missing"},
		} {
			if err := s.Revive(ctx, c.group, c.id); !errors.Is(err, inbox.ErrNotFound) {
				t.Errorf("Revive(%s, %s) = %v, want ErrNotFound", c.group, c.id, err)
			}
		}
		wantRecord(t, s, "loyalty", "ok-1", inbox.StatusSucceeded, 1)
		wantRecord(t, s, "loyalty", "failed-1", inbox.StatusFailed, 1)
		wantRecord(t, s, "mail", "dead-2", inbox.StatusDead, 2)

		// ReviveTx: the record is revived only if the transaction commits.
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ReviveTx(ctx, tx, "loyalty", "dead-1"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wantRecord(t, s, "loyalty", "dead-1", inbox.StatusDead, 2)
		if tx, err = db.BeginTx(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.ReviveTx(ctx, tx, "loyalty", "failed-1"); !errors.Is(err, inbox.ErrNotFound) {
			t.Errorf("ReviveTx of a failed record = %v, want ErrNotFound", err)
		}
		if err := s.ReviveTx(ctx, tx, "loyalty", "dead-1"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		r := wantRecord(t, s, "loyalty", "dead-1", inbox.StatusFailed, 0)
		if r.Fence != 2 || r.LastError != "cannot handle dead-1" {
			t.Fatalf("revived record %+v: want fence 2 and the last error kept", r)
		}
		if err := s.Revive(ctx, "loyalty", "dead-1"); !errors.Is(err, inbox.ErrNotFound) {
			t.Fatalf("second Revive: %v, want ErrNotFound", err)
		}
		if _, of := effects(t, srv, db, "dead-1"); of != 0 {
			t.Fatalf("%d effects of dead-1 before its retry", of)
		}
		// The next delivery runs the handler again.
		failing = false
		deliver(in, "dead-1", inbox.Processed)
		r = wantRecord(t, s, "loyalty", "dead-1", inbox.StatusSucceeded, 1)
		if r.Fence != 3 {
			t.Fatalf("fence %d after the retry, want 3", r.Fence)
		}
		if _, of := effects(t, srv, db, "dead-1"); of != 1 {
			t.Fatalf("%d effects of dead-1 after its retry, want 1", of)
		}
		deliver(in, "dead-1", inbox.Duplicate)
		// A revived record that fails again is dead after MaxAttempts
		// attempts more.
		if err := s.Revive(ctx, "mail", "dead-2"); err != nil {
			t.Fatal(err)
		}
		failing = true
		deliver(other, "dead-2", inbox.Retry)
		deliver(other, "dead-2", inbox.Dead)
		wantRecord(t, s, "mail", "dead-2", inbox.StatusDead, 2)
		if got := list(inbox.StatusDead, 0); got != "[mail/dead-2:2]" {
			t.Fatalf("dead after the retries: %s", got)
		}
	})
}

// List and Revive after Close fail with ErrClosed.
func TestInboxListClosed(t *testing.T) {
	db := openDB(t, t.TempDir()+"/closed.db")
	s := newInboxStore(t, db, sqlstore.SQLite)
	s.Close()
	if _, err := s.List(t.Context(), inbox.StatusDead, 0); !errors.Is(err, sqlstore.ErrClosed) {
		t.Fatalf("List after Close: %v", err)
	}
	if err := s.Revive(t.Context(), "g", "m"); !errors.Is(err, sqlstore.ErrClosed) {
		t.Fatalf("Revive after Close: %v", err)
	}
}
