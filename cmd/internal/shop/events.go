package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/outbox"
)

// The order's events. Each is written to the outbox (sqlstore's
// OutboxStore, the table idem_outbox) in the transaction of the
// transition it reports, and only when the transition moved the order (not
// when it was AlreadyApplied): a transition that commits has its event,
// one that rolls back has none, and thirty repeats of a payment callback
// write one order.paid. The outbox row's topic is the event's name; the
// relay (shopd) publishes it to the broker on EventTopic(-events, event).
const (
	EventOrderPaid      = "order.paid"
	EventOrderCancelled = "order.cancelled"
	EventOrderClosed    = "order.closed"
	EventOrderRefunded  = "order.refunded"
)

// EventTopic is the topic (a NATS subject, an AMQP routing key) event is
// published on in the namespace ns (-events): ns + "." + event, so that
// order.paid is "shop.order.paid" by default.
func EventTopic(ns, event string) string { return ns + "." + event }

// DefaultEventIDPrefix starts the ID of every event the shop writes (26
// characters of time and randomness follow, made when the event is
// written: outbox.NewID): Config.EventIDPrefix's default.
const DefaultEventIDPrefix = "shop-"

// OrderEvent is an event's payload (JSON). Its message key is the order
// number, so that one order's events are published in order.
type OrderEvent struct {
	OrderNo     string `json:"order_no"`
	UserID      int64  `json:"user_id"`
	AmountCents int64  `json:"amount_cents"`
	// Event is the event's name, e.g. "order.paid".
	Event string `json:"event"`
	// At is when the transition committed (the writer's clock), RFC 3339
	// in UTC to the millisecond.
	At string `json:"at"`
}

// eventTimeLayout is OrderEvent.At's layout.
const eventTimeLayout = "2006-01-02T15:04:05.000Z07:00"

const sqlOrderForEvent = `SELECT user_id, amount_cents FROM shop_orders WHERE order_no = ?`

// addEvent writes event about order orderNo to the outbox in tx, the
// transaction of the transition it reports. Call it only when that
// transition was not AlreadyApplied.
func (s *Shop) addEvent(ctx context.Context, tx *sql.Tx, event, orderNo string) error {
	ev := OrderEvent{OrderNo: orderNo, Event: event, At: time.Now().UTC().Format(eventTimeLayout)}
	if err := tx.QueryRowContext(ctx, rebind(s.dialect, sqlOrderForEvent), orderNo).Scan(&ev.UserID, &ev.AmountCents); err != nil {
		return fmt.Errorf("event %s: read order: %w", event, err)
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	// The trace of the request that moved the order (when shopd exports
	// spans) travels in the event's headers: the loyalty consumer's span
	// continues it.
	headers := idemotel.Inject(ctx, nil)
	if _, err := s.events.Add(ctx, tx, outbox.Message{Topic: event, Key: orderNo, Payload: payload, Headers: headers}); err != nil {
		return fmt.Errorf("event %s: %w", event, err)
	}
	return nil
}
