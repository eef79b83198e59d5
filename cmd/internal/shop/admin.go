package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/cmd/internal/admin"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// The operator page's shop parts (shopd -admin-token): the payments held
// for reconciliation, and the retry of a dead loyalty event.

// RetryOfHeader is the header of an event that the operator page's Retry
// published again: the ID of the dead message it retries. The loyalty
// consumer handles such a message under that ID (when it is one of the
// shop's, -event-prefix), so that it claims the revived consume record.
// The event itself has an ID of its own, the new outbox row's: NATS
// drops a message whose Nats-Msg-Id it saw within its 2-minute
// de-duplication window, and a dead message is usually younger than
// that. A dead message written before the prefix changed (-event-prefix)
// is not one of the shop's any more: republish its dead letter by hand.
const RetryOfHeader = "Idem-Retry-Of"

// RetryHelp says what RetryEvent does, on the operator page's
// confirmation.
const RetryHelp = "Retry makes the message's consume record failed again with no attempt counted, and writes the event again to the outbox, " +
	"rebuilt from the order as it is now (its user and amount; the event's name and time are the original's), " +
	"with the header " + RetryOfHeader + " naming this message: the relay publishes it, and the loyalty consumer handles it under this message's ID, " +
	"up to 5 attempts more. The ledger grants an order's points once whatever happens (a ledger row per order and event)."

// sqlOutboxEvent reads an event's outbox row by its message ID (the
// unique index of msg_id); sqlOutboxLegacyEvent one written before the
// ID was stored, whose ID is the prefix and the row's id.
const (
	sqlOutboxEvent       = `SELECT topic, msg_key, payload FROM idem_outbox WHERE msg_id = ?`
	sqlOutboxLegacyEvent = `SELECT topic, msg_key, payload FROM idem_outbox WHERE id = ? AND msg_id IS NULL`
)

// RetryEvent retries the dead loyalty event id (see RetryHelp): it reads
// the event's outbox row by its ID (idem_outbox.msg_id, or the row's id
// for an event written before the ID was stored), which must not have
// been swept (-event-retention),
// and, in one transaction, revives the consume record of id in group
// (sqlstore's InboxStore.ReviveTx) and adds the event to the outbox
// again. It fails, changing nothing, when id is not one of the shop's
// events, its row is gone, its record is not dead, or the event cannot be
// written: the message stays dead, and can be retried again.
func (s *Shop) RetryEvent(ctx context.Context, in *sqlstore.InboxStore, group, id string) error {
	if group != LoyaltyGroup {
		return fmt.Errorf("shop: retry: group %q is not the loyalty consumer's (%s)", group, LoyaltyGroup)
	}
	rest, ok := strings.CutPrefix(id, s.eventPrefix)
	if !ok || rest == "" {
		return fmt.Errorf("shop: retry: %q is not an event of this shop (IDs %s…)", id, s.eventPrefix)
	}
	query, arg := sqlOutboxEvent, any(id)
	if row, err := strconv.ParseInt(rest, 10, 64); err == nil && row > 0 && len(rest) < outbox.IDLen {
		query, arg = sqlOutboxLegacyEvent, row
	}
	var (
		topic, orderNo string
		payload        []byte
	)
	err := s.db.QueryRowContext(ctx, rebind(s.dialect, query), arg).Scan(&topic, &orderNo, &payload)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("shop: retry: event %s is no longer in the outbox (swept after -event-retention); publish its dead letter again by hand", id)
	}
	if err != nil {
		return fmt.Errorf("shop: retry: read event: %w", err)
	}
	event := eventOfTopic(topic)
	at := time.Now().UTC().Format(eventTimeLayout)
	var old OrderEvent
	if json.Unmarshal(payload, &old) == nil {
		if _, err := time.Parse(time.RFC3339Nano, old.At); err == nil {
			at = old.At
		}
	}
	// The record is revived in the transaction that writes the event
	// again: a retry that fails leaves the message dead, to be retried
	// again (a revived record without its event would wait for a delivery
	// that never comes, and the page retries only dead messages).
	ev := OrderEvent{OrderNo: orderNo, Event: event, At: at}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if err := in.ReviveTx(ctx, tx, group, id); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, rebind(s.dialect, sqlOrderForEvent), orderNo).Scan(&ev.UserID, &ev.AmountCents); err != nil {
			return fmt.Errorf("read order %q: %w", orderNo, err)
		}
		p, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if _, err := s.events.Add(ctx, tx, outbox.Message{Topic: event, Key: orderNo, Payload: p, Headers: map[string]string{RetryOfHeader: id}}); err != nil {
			return fmt.Errorf("add the event: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("shop: retry: %w", err)
	}
	s.log.InfoContext(ctx, "shop: dead event written to the outbox again", "event", event, "order_no", orderNo)
	return nil
}

// retriedID is the ID the loyalty consumer handles m under: the dead
// message's that the operator retried (RetryOfHeader, when it is one of
// the shop's), else m's own.
func (s *Shop) retriedID(m inbox.Message) string {
	if orig := m.Headers[RetryOfHeader]; orig != "" && strings.HasPrefix(orig, s.eventPrefix) {
		return orig
	}
	return m.ID
}

const sqlHeld = `SELECT trade_no, order_no, amount_cents, reason, created_ms FROM shop_reconciliations ORDER BY created_ms, id LIMIT ?`

// HeldNote describes HeldPayments on the operator page.
const HeldNote = "Signed payment callbacks the shop did not apply (an unknown order, a wrong amount, an order paid by another trade or no longer payable): refund or apply them by hand."

// HeldPayments lists the payments held for reconciliation (the table
// shop_reconciliations), the oldest first.
func (s *Shop) HeldPayments(ctx context.Context, limit int) ([]admin.Held, error) {
	rows, err := s.db.QueryContext(ctx, rebind(s.dialect, sqlHeld), limit)
	if err != nil {
		return nil, fmt.Errorf("read reconciliations: %w", err)
	}
	defer rows.Close()
	var out []admin.Held
	for rows.Next() {
		var (
			h  admin.Held
			ms int64
		)
		if err := rows.Scan(&h.Ref, &h.Order, &h.AmountCents, &h.Reason, &ms); err != nil {
			return nil, fmt.Errorf("read reconciliations: %w", err)
		}
		h.At = time.UnixMilli(ms)
		out = append(out, h)
	}
	return out, rows.Err()
}
