package shop

import (
	"context"
	"errors"
	"net/http"
)

// SimulatePayment exposes (*Shop).simulatePayment to the package's
// external tests.
func SimulatePayment(s *Shop, ctx context.Context, user int64, orderNo string) error {
	return s.simulatePayment(ctx, user, orderNo)
}

// ProblemCode is the code of err's *problemError, err's text for another
// error, "" for nil.
func ProblemCode(err error) string {
	var pe *problemError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pe):
		return pe.code
	}
	return err.Error()
}

// UnguardedPaymentCallback is POST /payments/callback without the
// idempotency middleware: the signature check and the business guards
// alone, as a callback meets them once its record has expired.
func UnguardedPaymentCallback(s *Shop) http.Handler {
	return s.signedByProvider(http.HandlerFunc(s.paymentCallback))
}
