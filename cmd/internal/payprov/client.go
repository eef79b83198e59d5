package payprov

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// RefusedError is the provider's definite refusal of an effect (402): it
// did not and will not happen under this key, whatever the retries.
type RefusedError struct {
	// Code is the reason: refund_refused, card_declined, shipment_refused.
	Code    string
	Message string
}

// Error returns the refusal's code and message.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("payprov: refused (%s): %s", e.Code, e.Message)
}

var (
	// ErrKeyReused is matched (errors.Is) by a *StatusError of 422: the
	// key was used before with another request. Retrying cannot help.
	ErrKeyReused = errors.New("payprov: idempotency key reused with another request")
	// ErrInProgress is matched (errors.Is) by a *StatusError of 409:
	// another request with the key is being handled. Retry later with the
	// key.
	ErrInProgress = errors.New("payprov: a request with this idempotency key is in progress")
)

// StatusError is an answer of the provider other than success and
// refusal: a malformed request (400), 409, 422 or a failure (5xx).
type StatusError struct {
	StatusCode int
	// Code and Message are the answer's error, empty when its body held
	// none (a proxy's 502, say).
	Code    string
	Message string
}

// Error returns the status and the provider's error.
func (e *StatusError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("payprov: status %d", e.StatusCode)
	}
	return fmt.Sprintf("payprov: status %d (%s): %s", e.StatusCode, e.Code, e.Message)
}

// Is reports whether e is the 422 of ErrKeyReused or the 409 of
// ErrInProgress.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrKeyReused:
		return e.StatusCode == http.StatusUnprocessableEntity
	case ErrInProgress:
		return e.StatusCode == http.StatusConflict
	}
	return false
}

// Retryable reports whether the same request may be sent again under the
// same key: err is not a refusal nor a 4xx other than 409 and 429. A
// timeout, a lost connection or a 5xx leave the outcome unknown, and
// the retry under the key either performs the effect or answers what the
// first attempt did.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if refused := (*RefusedError)(nil); errors.As(err, &refused) {
		return false
	}
	if se := (*StatusError)(nil); errors.As(err, &se) {
		return se.StatusCode >= 500 || se.StatusCode == http.StatusConflict || se.StatusCode == http.StatusTooManyRequests
	}
	return true
}

// Client calls a provider. The zero value is not usable: BaseURL is
// required.
type Client struct {
	// BaseURL is the provider's address, http://host:port.
	BaseURL string
	// HTTP sends the requests; nil means http.DefaultClient. Its Timeout,
	// or the context's deadline, bounds a call.
	HTTP *http.Client
}

// Refund refunds a payment under the idempotency key key (required).
// Errors: a *RefusedError when the provider refuses, for good; a
// *StatusError matching ErrKeyReused when key was used with another
// request, or of 400 for a malformed one; else (ErrInProgress, a 5xx, a
// timeout, a lost connection, a success whose answer names no effect)
// an error after which the outcome is unknown or the request was not
// handled: retry with the same key (Retryable reports which is which).
func (c *Client) Refund(ctx context.Context, key string, req RefundRequest) (Refund, error) {
	var out Refund
	err := c.do(ctx, http.MethodPost, "/v1/refunds", key, req, &out)
	return out, named(err, "/v1/refunds", out.ID)
}

// Charge charges a card under the idempotency key key; errors as Refund's.
func (c *Client) Charge(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	var out Charge
	err := c.do(ctx, http.MethodPost, "/v1/charges", key, req, &out)
	return out, named(err, "/v1/charges", out.ID)
}

// Ship creates a shipment under the idempotency key key; errors as
// Refund's.
func (c *Client) Ship(ctx context.Context, key string, req ShipmentRequest) (Shipment, error) {
	var out Shipment
	err := c.do(ctx, http.MethodPost, "/v1/shipments", key, req, &out)
	return out, named(err, "/v1/shipments", out.ID)
}

// named is the error of a call to path that answered err and an effect
// of id: a success that names no effect ({}, null, a proxy's answer) is
// no proof that the effect was made, nor that it was not, so it is an
// error after which the outcome is unknown (Retryable): the retry under
// the key gets the answer the provider stored.
func named(err error, path, id string) error {
	if err == nil && id == "" {
		return fmt.Errorf("payprov: POST %s: the answer names no effect (no id)", path)
	}
	return err
}

// SetFault queues f (POST /_control/faults).
func (c *Client) SetFault(ctx context.Context, f Fault) error {
	return c.do(ctx, http.MethodPost, "/_control/faults", "", f, nil)
}

// ClearFaults removes every queued fault (DELETE /_control/faults).
func (c *Client) ClearFaults(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/_control/faults", "", nil, nil)
}

// RegisterPayment makes p known to the provider (POST /_control/payments).
func (c *Client) RegisterPayment(ctx context.Context, p Payment) error {
	return c.do(ctx, http.MethodPost, "/_control/payments", "", p, nil)
}

// Ledger returns the effects of kind and the keys used with it (GET
// /_control/{kind}).
func (c *Client) Ledger(ctx context.Context, kind Kind) (Ledger, error) {
	var l Ledger
	return l, c.do(ctx, http.MethodGet, "/_control/"+string(kind), "", nil, &l)
}

// do sends a request with the JSON of in (none when nil) and decodes a
// 2xx answer into out (when not nil).
func (c *Client) do(ctx context.Context, method, path, key string, in, out any) error {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("payprov: %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, body)
	if err != nil {
		return fmt.Errorf("payprov: %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("payprov: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("payprov: %s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var eb errorBody
		json.Unmarshal(raw, &eb) // a body that is not the provider's leaves the code empty
		if resp.StatusCode == http.StatusPaymentRequired && eb.Error.Code != "" {
			return &RefusedError{Code: eb.Error.Code, Message: eb.Error.Message}
		}
		return &StatusError{StatusCode: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("payprov: %s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}
