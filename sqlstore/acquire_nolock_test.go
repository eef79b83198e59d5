package sqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// TestAcquireWriteLocksOnlyWhatItMayTake: on PostgreSQL, a duplicate whose
// acquire statement did not see the record (it was inserted after the
// statement's snapshot, the case of every request of a burst on a new
// key but the first) reaches idem_acquire_write. That function must
// answer a record another owner holds (in flight, or another
// fingerprint) without waiting for its row lock: when it locked it,
// the burst queued for the lock one after the other, and the owner's
// renewal, whose share lock waits behind them, was confirmed too late
// on a loaded server (an idem proxy with a 1 s lease lost its key to
// the other proxy, and the upstream was called twice). A record it may
// take over is still locked first. A transaction holds the row's lock
// here; lock_timeout turns a wait for it into SQLSTATE 55P03.
func TestAcquireWriteLocksOnlyWhatItMayTake(t *testing.T) {
	t.Parallel()
	db, s := servers[0].setup(t)
	ctx := t.Context()
	scope := randomName("nolock-")
	held := idem.AcquireRequest{Scope: scope, Key: "held", Fingerprint: "fp", Lease: long, Retention: long}
	ended := idem.AcquireRequest{Scope: scope, Key: "ended", Fingerprint: "fp", Lease: 20 * time.Millisecond, Retention: long}
	holder := mustAcquire(t, s, held, idem.Acquired).Lease
	mustAcquire(t, s, ended, idem.Acquired)
	time.Sleep(100 * time.Millisecond) // past the lease of "ended"

	owner := func(key string) (o string, fence int64) {
		t.Helper()
		if err := db.QueryRowContext(ctx, `SELECT owner, fence FROM idem_records WHERE scope = $1 AND idempotency_key = $2`,
			scope, key).Scan(&o, &fence); err != nil {
			t.Fatal(err)
		}
		return o, fence
	}
	heldOwner, _ := owner("held")

	for _, c := range []struct {
		key, fp   string
		wantOwner string // "" = waits for the lock
	}{
		{"held", "fp", heldOwner},    // a duplicate in flight
		{"held", "other", heldOwner}, // another fingerprint
		{"ended", "fp", ""},          // a takeover: it must lock the row first
	} {
		lockTx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lockTx.ExecContext(ctx, `SELECT 1 FROM idem_records WHERE scope = $1 AND idempotency_key = $2 FOR UPDATE`, scope, c.key); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
			t.Fatal(err)
		}
		var gotOwner string
		var fence int64
		err = tx.QueryRowContext(ctx, `SELECT owner, fence FROM idem_acquire_write($1, $2, $3, $4, 60000, 60000)`,
			scope, c.key, c.fp, idem.NewOwner()).Scan(&gotOwner, &fence)
		_ = tx.Rollback()
		_ = lockTx.Rollback()
		var pgErr *pgconn.PgError
		switch {
		case c.wantOwner == "":
			if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
				t.Fatalf("%s (fp %s): %v; want a wait for the row lock (55P03)", c.key, c.fp, err)
			}
		case err != nil:
			t.Fatalf("%s (fp %s): %v; want the holder's record at once", c.key, c.fp, err)
		case gotOwner != c.wantOwner || fence != holder.Fence:
			t.Fatalf("%s (fp %s): owner %.8s… fence %d; want the holder's (fence %d)", c.key, c.fp, gotOwner, fence, holder.Fence)
		}
	}

	// Nothing was written: the holder still holds "held", and "ended"
	// waits for the takeover that the lock kept out.
	if o, f := owner("held"); o != heldOwner || f != holder.Fence {
		t.Fatalf("held: owner changed to %.8s… fence %d", o, f)
	}
	if _, f := owner("ended"); f != 1 {
		t.Fatalf("ended: fence %d; want 1 (not taken over)", f)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if res, err := s.Acquire(cctx, ended); err != nil || res.Outcome != idem.Acquired || res.Lease.Fence != 2 || !res.TookOver {
		t.Fatalf("takeover of ended: %v %+v, %v; want Acquired with fence 2", res.Outcome, res.Lease, err)
	}
}
