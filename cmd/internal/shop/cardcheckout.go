package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/payprov"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/steps"
)

// A card checkout (POST /orders/{order_no}/card-checkout) pays a waiting
// order with a card at the payment provider and books its shipment with
// the carrier: two foreign calls, one after the other, as an operation of
// steps named "card-checkout":
//
//	charging  local    WAIT_PAY → CHARGING (the close job and a cancel leave it alone)
//	charge    foreign  the provider charges the card, under a key derived from the request's
//	declined  local    instead, when the card was declined: CHARGING → WAIT_PAY
//	paid      local    CHARGING → PAID, the payment row (its trade_no: the charge's id)
//	                   and order.paid, in one transaction
//	ship      foreign  the carrier books the shipment, under another derived key
//	shipped   local    the shipment row
//
// A failure of the shipment after the charge resumes at the shipment: the
// card is charged once however often the request is retried or resumed.

// checkoutOpName is the card checkout operation's name in the journal.
const checkoutOpName = "card-checkout"

// The card checkout's steps, by name (identities in the journal), as
// Config.AfterStep hears them; StepChargeCall and StepShipCall are the
// moments after the provider answered, before the answer's checkpoint.
const (
	StepCharging   = "charging"
	StepChargeCall = "charge-call"
	StepCharge     = "charge"
	StepDeclined   = "declined"
	StepPaid       = "paid"
	StepShipCall   = "ship-call"
	StepShip       = "ship"
	StepShipped    = "shipped"
)

// The card checkout's local steps.
var (
	chargingStep = steps.Step[int64]{Name: StepCharging, Retry: retryable}
	declinedStep = steps.Step[bool]{Name: StepDeclined, Retry: retryable}
	paidStep     = steps.Step[bool]{Name: StepPaid, Retry: retryable}
	shippedStep  = steps.Step[bool]{Name: StepShipped, Retry: retryable}
)

// Statements of card checkouts, written with ? (rebind).
const (
	sqlInsertShipment = `INSERT INTO shop_shipments (order_no, shipment_id, tracking_number, address, created_ms) VALUES (?, ?, ?, ?, ?)`
	sqlInsertCharge   = `INSERT INTO shop_payments (trade_no, order_no, amount_cents, created_ms) VALUES (?, ?, ?, ?)`
)

// Limits of a card checkout's body.
const maxAddressLen = 200

var sourcePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$`)

// CardCheckout is a card checkout's answer: the order paid by the charge
// and shipped.
type CardCheckout struct {
	OrderNo     string `json:"order_no"`
	Status      string `json:"status"`
	AmountCents int64  `json:"amount_cents"`
	// ChargeID is the provider's charge (ch_…); empty for an order of 0
	// cents, which is not charged.
	ChargeID       string `json:"charge_id,omitempty"`
	ShipmentID     string `json:"shipment_id"`
	TrackingNumber string `json:"tracking_number"`
}

// checkoutInput is the card checkout's input, kept in the journal.
type checkoutInput struct {
	User    int64  `json:"user"`
	OrderNo string `json:"order_no"`
	Source  string `json:"source"`
	Address string `json:"address"`
}

// defineCheckout defines the card checkout operation on r.
func (s *Shop) defineCheckout(r *steps.Runner) (*steps.Op[checkoutInput, CardCheckout], error) {
	return steps.Define(r, checkoutOpName, s.checkoutSteps, &steps.OpConfig[checkoutInput, CardCheckout]{
		Encode: func(out CardCheckout, err error) (idem.Response, error, bool) {
			return encodeOp(http.StatusCreated, out, err)
		},
		Decode: func(resp idem.Response, replayed bool) (CardCheckout, error) {
			var out CardCheckout
			err := decodeOp(resp, replayed, &out)
			return out, err
		},
	})
}

// checkoutSteps is the card checkout operation.
func (s *Shop) checkoutSteps(ctx context.Context, run *steps.Run, in checkoutInput) (CardCheckout, error) {
	amount, err := chargingStep.Local(run, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		return s.beginCheckout(ctx, tx, in)
	})
	if err != nil {
		return CardCheckout{}, err
	}
	s.afterStep(StepCharging)
	var charge providerCall
	if amount > 0 { // an order free after its coupon is not charged
		charge, err = steps.Foreign(run, StepCharge, func(ctx context.Context, key string) (providerCall, error) {
			return callProvider(func() (providerCall, error) {
				ch, err := s.provider.Charge(ctx, key, payprov.ChargeRequest{AmountCents: amount, Currency: Currency, Source: in.Source, Description: "order " + in.OrderNo})
				s.afterStep(StepChargeCall)
				return providerCall{ID: ch.ID}, err
			})
		})
		if err != nil {
			return CardCheckout{}, err
		}
		s.afterStep(StepCharge)
	}
	if charge.Refused != "" {
		if _, err := declinedStep.Local(run, func(ctx context.Context, tx *sql.Tx) (bool, error) {
			return true, s.leaveHeld(ctx, tx, in.OrderNo, trDeclined)
		}); err != nil {
			return CardCheckout{}, err
		}
		s.afterStep(StepDeclined)
		return CardCheckout{}, &idem.DefiniteError{Code: CodeCardDeclined,
			Message: fmt.Sprintf("the payment provider declined the card for order %s (%s: %s); the order still waits for its payment", in.OrderNo, charge.Refused, charge.Message)}
	}
	if _, err := paidStep.Local(run, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		return true, s.markCharged(ctx, tx, in.OrderNo, charge.ID, amount)
	}); err != nil {
		return CardCheckout{}, err
	}
	s.afterStep(StepPaid)
	ship, err := steps.Foreign(run, StepShip, func(ctx context.Context, key string) (providerCall, error) {
		return callProvider(func() (providerCall, error) {
			sh, err := s.provider.Ship(ctx, key, payprov.ShipmentRequest{Order: in.OrderNo, Address: in.Address})
			s.afterStep(StepShipCall)
			return providerCall{ID: sh.ID, Tracking: sh.TrackingNumber}, err
		})
	})
	if err != nil {
		return CardCheckout{}, err
	}
	s.afterStep(StepShip)
	if ship.Refused != "" {
		return CardCheckout{}, &idem.DefiniteError{Code: CodeShipmentRefused,
			Message: fmt.Sprintf("order %s is paid, but the carrier refused to ship it (%s: %s); refund it or ask support", in.OrderNo, ship.Refused, ship.Message)}
	}
	if _, err := shippedStep.Local(run, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		_, err := tx.ExecContext(ctx, rebind(s.dialect, sqlInsertShipment), in.OrderNo, ship.ID, ship.Tracking, in.Address, time.Now().UnixMilli())
		return true, err
	}); err != nil {
		return CardCheckout{}, err
	}
	s.afterStep(StepShipped)
	return CardCheckout{OrderNo: in.OrderNo, Status: StatusPaid, AmountCents: amount, ChargeID: charge.ID, ShipmentID: ship.ID, TrackingNumber: ship.Tracking}, nil
}

// beginCheckout is the charging step: user's order in.OrderNo, waiting
// for its payment, moves to CHARGING with the version it read; it returns
// the amount to charge. Refusals are *problemError: NOT_FOUND,
// ORDER_NOT_PAYABLE (not waiting for its payment), CHECKOUT_IN_PROGRESS
// (another request charges it).
func (s *Shop) beginCheckout(ctx context.Context, tx *sql.Tx, in checkoutInput) (int64, error) {
	o, other, err := s.holdOrder(ctx, tx, in.User, in.OrderNo, trCharge)
	switch {
	case err != nil:
		return 0, err
	case other == StatusCharging:
		return 0, &problemError{http.StatusConflict, CodeCheckoutInProgress, "Checkout in progress",
			fmt.Sprintf("order %s is being charged by another request; retry later", in.OrderNo)}
	case other != "":
		return 0, &problemError{http.StatusConflict, CodeOrderNotPayable, "Order not payable",
			fmt.Sprintf("order %s is %s; only an order waiting for its payment (WAIT_PAY) can be checked out", in.OrderNo, other)}
	}
	return o.AmountCents, nil
}

// markCharged is the paid step: CHARGING → PAID, the payment row of the
// charge (none for an order of 0 cents) and order.paid, in tx.
func (s *Shop) markCharged(ctx context.Context, tx *sql.Tx, orderNo, chargeID string, amount int64) error {
	if err := s.leaveHeld(ctx, tx, orderNo, trCharged); err != nil {
		return err
	}
	if chargeID != "" {
		if _, err := tx.ExecContext(ctx, rebind(s.dialect, sqlInsertCharge), chargeID, orderNo, amount, time.Now().UnixMilli()); err != nil {
			return fmt.Errorf("record the charge: %w", err)
		}
	}
	return s.addEvent(ctx, tx, EventOrderPaid, orderNo)
}

// parseCardCheckout reads the body of a card checkout: one JSON object
// {"source": string, "address": string}, member names exactly so, each
// once.
func parseCardCheckout(body []byte) (source, address string, err error) {
	const shape = `body must be a JSON object {"source": string, "address": string}`
	members, err := strictObject(body, "source", "address")
	if err != nil {
		return "", "", fmt.Errorf("%s: %v", shape, err)
	}
	if json.Unmarshal(members["source"], &source) != nil || !sourcePattern.MatchString(source) {
		return "", "", errors.New("source must be a card token of 1 to 64 letters, digits, '_', '.', ':' or '-' (tok_visa)")
	}
	if json.Unmarshal(members["address"], &address) != nil || strings.TrimSpace(address) == "" || len(address) > maxAddressLen ||
		!utf8.ValidString(address) || strings.ContainsFunc(address, unicode.IsControl) {
		return "", "", fmt.Errorf("address must be a string of 1 to %d bytes of text without control characters", maxAddressLen)
	}
	return source, address, nil
}

// cardCheckoutHandler serves POST /orders/{order_no}/card-checkout: it
// runs the card checkout inside the request's execution.
func (s *Shop) cardCheckoutHandler(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", "cannot read the body")
		return
	}
	source, address, err := parseCardCheckout(body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, idemhttp.CodeInvalidRequest, "Invalid request", err.Error())
		return
	}
	out, err := s.cardOp.Run(ctx, checkoutInput{User: userFrom(ctx), OrderNo: r.PathValue("order_no"), Source: source, Address: address})
	resp, _, stored := encodeOp(http.StatusCreated, out, err)
	s.answerOp(w, r, "card checkout", resp, stored, err)
}
