package payprov

import (
	"errors"
	"fmt"
	"regexp"
)

// Kind names one of the provider's resources, as the last element of its
// inspection path (GET /_control/refunds).
type Kind string

// The provider's resources.
const (
	KindRefund   Kind = "refunds"
	KindCharge   Kind = "charges"
	KindShipment Kind = "shipments"
)

// RefundRequest is the body of POST /v1/refunds: refund AmountCents of the
// payment Payment.
type RefundRequest struct {
	Payment     string `json:"payment"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Reason      string `json:"reason,omitempty"`
}

// Refund is a refund the provider made.
type Refund struct {
	ID          string `json:"id"`
	Payment     string `json:"payment"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Reason      string `json:"reason,omitempty"`
	Status      string `json:"status"`
	Created     int64  `json:"created"`
}

// ChargeRequest is the body of POST /v1/charges: charge AmountCents to the
// card Source. The source "tok_chargeDeclined" is always declined.
type ChargeRequest struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Source      string `json:"source"`
	Description string `json:"description,omitempty"`
}

// Charge is a charge the provider made.
type Charge struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Source      string `json:"source"`
	Description string `json:"description,omitempty"`
	Status      string `json:"status"`
	Created     int64  `json:"created"`
}

// ShipmentRequest is the body of POST /v1/shipments: ship the order Order
// to Address.
type ShipmentRequest struct {
	Order   string `json:"order"`
	Address string `json:"address"`
}

// Shipment is a shipment the provider (here a carrier) created.
type Shipment struct {
	ID             string `json:"id"`
	Order          string `json:"order"`
	Address        string `json:"address"`
	TrackingNumber string `json:"tracking_number"`
	Status         string `json:"status"`
	Created        int64  `json:"created"`
}

// DeclinedSource is the card source that POST /v1/charges always declines.
const DeclinedSource = "tok_chargeDeclined"

// An effectRequest is the decoded body of a POST that performs an effect.
// create runs under the server's lock; it returns the resource to record
// or the provider's refusal.
type effectRequest interface {
	validate() error
	create(st *state, id string, created int64) (any, *RefusedError)
}

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

func validateAmount(cents int64, currency string) error {
	if cents <= 0 {
		return fmt.Errorf("amount_cents must be positive, not %d", cents)
	}
	if !currencyPattern.MatchString(currency) {
		return fmt.Errorf("currency must be three capital letters (EUR), not %q", currency)
	}
	return nil
}

func (r *RefundRequest) validate() error {
	if r.Payment == "" {
		return errors.New("payment is required")
	}
	return validateAmount(r.AmountCents, r.Currency)
}

// create refunds unless the payment is registered as non-refundable or the
// refunds of the payment would total more than its limit: the amount it was
// registered with, else the server's RefundLimitCents (0: none).
func (r *RefundRequest) create(st *state, id string, created int64) (any, *RefusedError) {
	p, registered := st.Payments[r.Payment]
	if registered && p.NonRefundable {
		return nil, &RefusedError{Code: "refund_refused", Message: fmt.Sprintf("payment %q is not refundable", r.Payment)}
	}
	limit := st.RefundLimitCents
	if registered && p.AmountCents > 0 {
		limit = p.AmountCents
	}
	total := st.Refunded[r.Payment] + r.AmountCents
	if limit > 0 && total > limit {
		return nil, &RefusedError{Code: "refund_refused", Message: fmt.Sprintf(
			"refunds of payment %q would total %d cents, over its %d", r.Payment, total, limit)}
	}
	st.Refunded[r.Payment] = total
	return Refund{ID: id, Payment: r.Payment, AmountCents: r.AmountCents, Currency: r.Currency,
		Reason: r.Reason, Status: "succeeded", Created: created}, nil
}

func (r *ChargeRequest) validate() error {
	if r.Source == "" {
		return errors.New("source is required")
	}
	return validateAmount(r.AmountCents, r.Currency)
}

func (r *ChargeRequest) create(_ *state, id string, created int64) (any, *RefusedError) {
	if r.Source == DeclinedSource {
		return nil, &RefusedError{Code: "card_declined", Message: "the card was declined"}
	}
	return Charge{ID: id, AmountCents: r.AmountCents, Currency: r.Currency, Source: r.Source,
		Description: r.Description, Status: "succeeded", Created: created}, nil
}

func (r *ShipmentRequest) validate() error {
	if r.Order == "" || r.Address == "" {
		return errors.New("order and address are required")
	}
	return nil
}

func (r *ShipmentRequest) create(_ *state, id string, created int64) (any, *RefusedError) {
	return Shipment{ID: id, Order: r.Order, Address: r.Address, TrackingNumber: "TRK" + id[len("shp_"):],
		Status: "created", Created: created}, nil
}

// A resource is one endpoint that performs an effect: everything the
// shared idempotent core needs to know about it.
type resource struct {
	kind     Kind
	path     string
	idPrefix string
	// refusal is the code of a refusal by an injected fault.
	refusal string
	newReq  func() effectRequest
}

var resources = []resource{
	{KindRefund, "/v1/refunds", "re_", "refund_refused", func() effectRequest { return new(RefundRequest) }},
	{KindCharge, "/v1/charges", "ch_", "card_declined", func() effectRequest { return new(ChargeRequest) }},
	{KindShipment, "/v1/shipments", "shp_", "shipment_refused", func() effectRequest { return new(ShipmentRequest) }},
}

func resourceOf(kind Kind) (resource, bool) {
	for _, r := range resources {
		if r.kind == kind {
			return r, true
		}
	}
	return resource{}, false
}
