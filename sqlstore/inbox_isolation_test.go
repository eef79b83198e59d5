package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/inbox"
)

// isoBeginner begins every transaction at one isolation level, as a
// database whose default is that level would.
type isoBeginner struct {
	db  *sql.DB
	iso sql.IsolationLevel
}

func (b isoBeginner) BeginTx(ctx context.Context, _ *sql.TxOptions) (*sql.Tx, error) {
	return b.db.BeginTx(ctx, &sql.TxOptions{Isolation: b.iso})
}

// TestInboxHandleTxIsolation: HandleTx in transactions at REPEATABLE READ
// and SERIALIZABLE (PostgreSQL: snapshot; MySQL: a locking read beside
// the snapshot), 8 goroutines delivering each of 10 messages, whose first
// attempt fails (a failed record, taken over by the next claim): each
// message's effect commits exactly once, on its second attempt or later.
// A serialisation failure is a Retry with an error, redelivered.
func TestInboxHandleTxIsolation(t *testing.T) {
	forServers(t, func(t *testing.T, srv server) {
		for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
			t.Run(iso.String(), func(t *testing.T) {
				db, _, s := inboxSetup(t, srv)
				in := newSQLInbox(t, s, inbox.Config{Backoff: func(int) time.Duration { return 0 }})
				b := isoBeginner{db, iso}
				const msgs, goroutines = 10, 8
				var processed atomic.Int64
				eff := effect(srv, "p")
				h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
					if d.Attempt == 1 {
						return errors.New("first attempt fails")
					}
					return eff(ctx, tx, d)
				}
				var wg sync.WaitGroup
				for g := range goroutines {
					wg.Go(func() {
						for i := range msgs {
							id := fmt.Sprint("m-", (i+g)%msgs)
							for tries := 0; ; tries++ {
								o, err := in.HandleTx(t.Context(), b, inbox.Message{ID: id}, h)
								if err == nil && o.Result == inbox.Processed {
									processed.Add(1)
								}
								if err == nil && o.Result.Ack() {
									break
								}
								if tries > 2000 {
									t.Errorf("%s: no ack after %d deliveries: %+v %v", id, tries, o, err)
									return
								}
								time.Sleep(time.Millisecond)
							}
						}
					})
				}
				wg.Wait()
				var rows, distinct int
				if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT message_id) FROM inbox_effects`).Scan(&rows, &distinct); err != nil {
					t.Fatal(err)
				}
				if rows != msgs || distinct != msgs || processed.Load() != msgs {
					t.Fatalf("%d effect rows, %d distinct, %d processed; want %d", rows, distinct, processed.Load(), msgs)
				}
				for i := range msgs {
					r, err := s.Get(t.Context(), "loyalty", fmt.Sprint("m-", i))
					if err != nil || r.Status != inbox.StatusSucceeded || r.Attempts < 2 {
						t.Errorf("record m-%d = %+v, %v; want succeeded after 2 attempts or more", i, r, err)
					}
				}
			})
		}
	})
}
