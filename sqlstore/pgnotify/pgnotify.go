// Package pgnotify wakes the outbox relays of package outbox on PostgreSQL
// with LISTEN/NOTIFY, through a pgx pool (github.com/jackc/pgx/v5/stdlib).
//
// sqlstore's outbox migration installs a trigger that notifies the
// channel sqlstore.OutboxChannel on every insert into idem_outbox. Wrap
// the OutboxStore with Outbox and give the result to outbox.NewRelay: the
// relay then claims as soon as a message commits, and polls (its
// PollInterval) only as a fallback. Without it a relay polls.
//
// It is a package of its own so that only a PostgreSQL program compiles
// pgx: sqlstore itself does not import it.
//
// Each listening relay holds one connection of the pool while it runs
// (closed, not returned to the pool, when the relay stops). PostgreSQL
// serialises the commits of transactions that notify: a heavy stream of
// concurrent inserts pays for the wake-ups.
package pgnotify

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// Store is an OutboxStore that is also an outbox.Notifier.
type Store struct {
	*sqlstore.OutboxStore
	db *sql.DB
}

var (
	_ outbox.Store    = (*Store)(nil)
	_ outbox.Notifier = (*Store)(nil)
)

// Outbox returns s with LISTEN/NOTIFY on db, the pgx (stdlib) pool s uses.
func Outbox(s *sqlstore.OutboxStore, db *sql.DB) *Store {
	return &Store{OutboxStore: s, db: db}
}

// Listen implements outbox.Notifier: it takes a connection of the pool,
// LISTENs on sqlstore.OutboxChannel, and calls wake once listening and
// then on every notification, until ctx ends; the connection is then
// closed, not returned to the pool. A pool whose driver is not pgx's
// stdlib answers outbox.ErrNoNotify.
func (s *Store) Listen(ctx context.Context, wake func()) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("pgnotify: listen: %w", err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return outbox.ErrNoNotify
		}
		c := pc.Conn()
		if _, err := c.Exec(ctx, "LISTEN "+sqlstore.OutboxChannel); err != nil {
			return errors.Join(err, driver.ErrBadConn)
		}
		wake()
		for {
			if _, err := c.WaitForNotification(ctx); err != nil {
				// The connection listens: it must not go back to the pool.
				return errors.Join(err, driver.ErrBadConn)
			}
			wake()
		}
	})
	if errors.Is(err, outbox.ErrNoNotify) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return fmt.Errorf("pgnotify: listen: %w", err)
}
