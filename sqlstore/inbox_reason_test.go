package sqlstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
)

// A failed attempt's reason is kept whatever its bytes: an error text
// with invalid UTF-8 or a NUL (a driver's, a decoder's) is stored with
// those replaced, not refused (PostgreSQL's text refuses both), so the
// failure is counted and the message is retried or dead as it should.
func TestInboxFailKeepsAnyReason(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, _ := srv.setup(t)
		s := newInboxStore(t, db, srv.dialect)
		ctx := t.Context()
		id := randomName("reason-")
		c, err := s.Claim(ctx, "g", id, time.Minute, 5)
		if err != nil || !c.Claimed {
			t.Fatalf("Claim: %+v, %v", c, err)
		}
		st, err := s.Fail(ctx, "g", id, c.Fence, 5, "bad \xff bytes and a \x00 NUL")
		if err != nil {
			t.Fatalf("Fail: %v", err)
		}
		if st != inbox.StatusFailed {
			t.Fatalf("Fail: status %s, want failed", st)
		}
		rec, err := s.Get(ctx, "g", id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Attempts != 1 || !strings.HasPrefix(rec.LastError, "bad ") || !strings.Contains(rec.LastError, "NUL") {
			t.Fatalf("record: %+v", rec)
		}
	})
}
