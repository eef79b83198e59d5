package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/sqlstore"
)

// The loyalty programme: a consumer of the order events grants points for
// order.paid and takes them back on order.refunded. It handles each
// message with inbox.HandleTx on the shop's database, so the ledger row
// and the message's consume record commit together: a redelivered event
// (a lost ack, a relay that published twice) is a duplicate and changes
// nothing.

// LoyaltyGroup is the loyalty consumer's inbox group (in the shop's
// database, whatever -events is: renaming the broker's names keeps the
// consume records that de-duplicate redeliveries). Its durable consumer
// (NATS) and its queue (AMQP) are named after -events: NAME-loyalty.
const LoyaltyGroup = "shop-loyalty"

// PointsPerUnit is how many points a whole currency unit (100 cents) of
// an order's amount earns; parts of a unit earn nothing: 1299 cents → 120.
const PointsPerUnit = 10

// PointsFor is the points an order of amountCents earns.
func PointsFor(amountCents int64) int64 { return amountCents / 100 * PointsPerUnit }

// LoyaltyEvents are the events the loyalty consumer handles.
var LoyaltyEvents = []string{EventOrderPaid, EventOrderRefunded}

// errBadEvent: an event's payload cannot be read, or does not match the
// order it names; the handler fails, and the message is retried, then
// dead-lettered.
var errBadEvent = errors.New("shop: malformed order event")

type pointsQueries struct {
	insert, ledger string
	// order reads and locks the order an event is about; orderRows reads
	// the ledger rows of an order, after that lock: it sees the rows of
	// the order's other event committed while this transaction waited
	// for the lock (PostgreSQL at READ COMMITTED reads at the statement;
	// MySQL at REPEATABLE READ takes its snapshot at the transaction's
	// first plain read, which this is: the inbox's claim and the order's
	// read lock rows). A locking read would take gap locks on MySQL, and
	// two events of different orders, whose ledger rows fall in one gap,
	// deadlocked at their inserts.
	order, orderRows string
}

func newPointsQueries(d sqlstore.Dialect) pointsQueries {
	insert := `INSERT INTO shop_points (user_id, order_no, event, points, at_ms) VALUES (?, ?, ?, ?, ?)`
	if d == sqlstore.MySQL {
		insert += ` ON DUPLICATE KEY UPDATE points = points`
	} else {
		insert += ` ON CONFLICT (order_no, event) DO NOTHING`
	}
	return pointsQueries{
		insert: rebind(d, insert),
		// One statement, so the balance is the sum of the rows it reads
		// (the window's sum is over all of them, before the LIMIT).
		ledger:    rebind(d, `SELECT order_no, event, points, at_ms, SUM(points) OVER () FROM shop_points WHERE user_id = ? ORDER BY id LIMIT ?`),
		order:     rebind(d, `SELECT user_id, amount_cents, status FROM shop_orders WHERE order_no = ?`+forUpdate(d)),
		orderRows: rebind(d, `SELECT event, points FROM shop_points WHERE order_no = ?`),
	}
}

// HandleLoyalty is the loyalty consumer's inbox.TxHandler: for an
// order.paid event it writes a ledger row of PointsFor(amount_cents)
// points, for order.refunded one that takes back what the order.paid row
// granted, in tx (the inbox's transaction). A row of that order and event
// that exists already is left as it is. Other events are ignored
// (success, no row).
//
// An event is not taken on its word: the order it names is read (and
// locked) in tx, and an event whose order the shop does not have, whose
// user or amount is not the order's, or whose order is not in a state
// that event leads to (order.paid: paid or refunded; order.refunded:
// refunded) is an error, as is a payload that is not an OrderEvent: the
// message is retried, then dead-lettered, and grants nothing.
//
// The two events of one order may be handled in either order (a failed
// order.paid is redelivered after its order.refunded) or at once (two
// workers): the order's lock serialises them, an order.refunded handled
// first takes back nothing (its row has 0 points), and an order.paid
// handled after its order.refunded grants nothing (0 points), so the
// balance never goes below zero and a refunded order's points net to 0.
func (s *Shop) HandleLoyalty(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
	var ev OrderEvent
	if err := json.Unmarshal(d.Payload, &ev); err != nil {
		return fmt.Errorf("%w: %v", errBadEvent, err)
	}
	switch ev.Event {
	case EventOrderPaid, EventOrderRefunded:
	default:
		return nil
	}
	if h := loyaltyFailHook; h != nil {
		if err := h(ev); err != nil {
			return err
		}
	}
	at, err := time.Parse(time.RFC3339Nano, ev.At)
	if err != nil || ev.OrderNo == "" || ev.UserID <= 0 || ev.AmountCents < 0 {
		return fmt.Errorf("%w: %.200s", errBadEvent, d.Payload)
	}
	var (
		user, amount int64
		status       string
	)
	err = tx.QueryRowContext(ctx, s.points.order, ev.OrderNo).Scan(&user, &amount, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: %s of order %.100q, which the shop does not have", errBadEvent, ev.Event, ev.OrderNo)
	case err != nil:
		return fmt.Errorf("loyalty: read order: %w", err)
	case user != ev.UserID || amount != ev.AmountCents:
		return fmt.Errorf("%w: %s of order %s for user %d and %d cents; the order is user %d's, of %d cents",
			errBadEvent, ev.Event, ev.OrderNo, ev.UserID, ev.AmountCents, user, amount)
	case ev.Event == EventOrderPaid && status != StatusPaid && status != StatusRefunding && status != StatusRefunded,
		ev.Event == EventOrderRefunded && status != StatusRefunded:
		return fmt.Errorf("%w: %s of order %s, which is %s", errBadEvent, ev.Event, ev.OrderNo, status)
	}
	rows, err := s.orderPoints(ctx, tx, ev.OrderNo)
	if err != nil {
		return err
	}
	if _, ok := rows[ev.Event]; ok {
		return nil // an event delivered under another message ID
	}
	var points int64
	switch ev.Event {
	case EventOrderPaid:
		if _, refunded := rows[EventOrderRefunded]; !refunded {
			points = PointsFor(amount)
		}
	case EventOrderRefunded:
		points = -rows[EventOrderPaid]
	}
	if _, err := tx.ExecContext(ctx, s.points.insert, user, ev.OrderNo, ev.Event, points, at.UnixMilli()); err != nil {
		return fmt.Errorf("loyalty: write ledger: %w", err)
	}
	return nil
}

// orderPoints reads the points of each ledger row of order orderNo, by
// event, in tx.
func (s *Shop) orderPoints(ctx context.Context, tx *sql.Tx, orderNo string) (map[string]int64, error) {
	rows, err := tx.QueryContext(ctx, s.points.orderRows, orderNo)
	if err != nil {
		return nil, fmt.Errorf("loyalty: read ledger: %w", err)
	}
	defer rows.Close()
	m := map[string]int64{}
	for rows.Next() {
		var event string
		var points int64
		if err := rows.Scan(&event, &points); err != nil {
			return nil, fmt.Errorf("loyalty: read ledger: %w", err)
		}
		m[event] = points
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("loyalty: read ledger: %w", err)
	}
	return m, nil
}

// PointsEntry is a row of the loyalty ledger as the API shows it.
type PointsEntry struct {
	OrderNo string `json:"order_no"`
	Event   string `json:"event"`
	Points  int64  `json:"points"`
	// At is the event's time, RFC 3339 in UTC to the millisecond.
	At string `json:"at"`
}

// Points is the answer of GET /users/me/points.
type Points struct {
	// Balance is the sum of the ledger's points (all of them, also when
	// the ledger shown is cut at maxLedger rows).
	Balance int64         `json:"balance"`
	Ledger  []PointsEntry `json:"ledger"`
}

// maxLedger is the most ledger rows GET /users/me/points shows (the
// oldest first).
const maxLedger = 1000

// pointsOf reads user's balance and ledger, in one statement: a grant
// committed meanwhile is in both or in neither.
func (s *Shop) pointsOf(ctx context.Context, user int64) (Points, error) {
	p := Points{Ledger: []PointsEntry{}}
	rows, err := s.db.QueryContext(ctx, s.points.ledger, user, maxLedger)
	if err != nil {
		return Points{}, fmt.Errorf("read ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e PointsEntry
		var ms int64
		if err := rows.Scan(&e.OrderNo, &e.Event, &e.Points, &ms, &p.Balance); err != nil {
			return Points{}, fmt.Errorf("read ledger: %w", err)
		}
		e.At = time.UnixMilli(ms).UTC().Format(eventTimeLayout)
		p.Ledger = append(p.Ledger, e)
	}
	if err := rows.Err(); err != nil {
		return Points{}, fmt.Errorf("read ledger: %w", err)
	}
	return p, nil
}

func (s *Shop) pointsHandler(w http.ResponseWriter, r *http.Request) {
	p, err := s.pointsOf(r.Context(), userFrom(r.Context()))
	if err != nil {
		s.answerError(w, r, "read points", err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}
