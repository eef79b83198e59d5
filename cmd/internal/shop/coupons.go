package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Claim is a user's claim of a coupon as the API shows it: UNUSED until an
// order uses it (USED, with the order's number), UNUSED again if that
// order is cancelled or closed unpaid.
type Claim struct {
	ClaimID  int64  `json:"claim_id"`
	CouponID int64  `json:"coupon_id"`
	UserID   int64  `json:"user_id"`
	Status   string `json:"status"`
	OrderNo  string `json:"order_no,omitempty"`
}

// Statements of coupons, written with ? (rebind).
const (
	sqlCouponExists = `SELECT 1 FROM shop_coupons WHERE id = ?`
	sqlInsertClaim  = `INSERT INTO shop_coupon_claims (coupon_id, user_id, status, claimed_ms) VALUES (?, ?, 'UNUSED', ?)`
	sqlGetClaim     = `SELECT id, coupon_id, user_id, status, order_no FROM shop_coupon_claims WHERE user_id = ? AND coupon_id = ?`
	sqlListClaims   = `SELECT id, coupon_id, user_id, status, order_no FROM shop_coupon_claims WHERE user_id = ? ORDER BY id`
	// The coupon's total is enforced by one conditional update: claimed
	// never passes total however many claims race for the last one.
	sqlTakeCoupon = `UPDATE shop_coupons SET claimed = claimed + 1 WHERE id = ? AND claimed < total`
)

func scanClaim(row interface{ Scan(...any) error }) (Claim, error) {
	var c Claim
	var order sql.NullString
	err := row.Scan(&c.ClaimID, &c.CouponID, &c.UserID, &c.Status, &order)
	c.OrderNo = order.String
	return c, err
}

// claimCoupon claims coupon for user, once: in one transaction it inserts
// the claim row, unique on (user, coupon) — a duplicate reads the claim
// that is there and takes nothing — and, only when it created the row,
// takes one of the coupon's total with one conditional update; none left
// rolls the claim back. It returns the claim and whether this call created
// it. Refusals are *problemError: NOT_FOUND (no such coupon),
// COUPON_SOLD_OUT.
func (s *Shop) claimCoupon(ctx context.Context, user, coupon int64) (Claim, bool, error) {
	var claim Claim
	var created bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		// The coupon's row is locked first: on MySQL the claim's foreign
		// key takes a shared lock on it, and two claims holding that lock
		// and both wanting to update the row would deadlock.
		var one int
		switch err := tx.QueryRowContext(ctx, rebind(s.dialect, sqlCouponExists+forUpdate(s.dialect)), coupon).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			return &problemError{http.StatusNotFound, CodeNotFound, "Not found", fmt.Sprintf("no coupon has the id %d", coupon)}
		case err != nil:
			return fmt.Errorf("read coupon: %w", err)
		}
		get := func(ctx context.Context, q querier) (Claim, error) {
			return scanClaim(q.QueryRowContext(ctx, rebind(s.dialect, sqlGetClaim+lockingRead(s.dialect)), user, coupon))
		}
		var err error
		_, created, err = insertOrGet(ctx, tx,
			func(ctx context.Context, q querier) (Claim, error) {
				_, err := q.ExecContext(ctx, rebind(s.dialect, sqlInsertClaim), coupon, user, time.Now().UnixMilli())
				return Claim{}, err
			}, get)
		if err != nil {
			return fmt.Errorf("claim row: %w", err)
		}
		if created {
			res, err := tx.ExecContext(ctx, rebind(s.dialect, sqlTakeCoupon), coupon)
			if err != nil {
				return fmt.Errorf("take coupon: %w", err)
			}
			if n, err := res.RowsAffected(); err != nil {
				return fmt.Errorf("take coupon: %w", err)
			} else if n == 0 {
				return &problemError{http.StatusConflict, CodeCouponSoldOut, "Coupon sold out",
					fmt.Sprintf("every claim of coupon %d is taken", coupon)}
			}
		}
		claim, err = get(ctx, tx)
		return err
	})
	return claim, created, err
}

func (s *Shop) claimHandler(w http.ResponseWriter, r *http.Request) {
	raw := r.PathValue("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != raw {
		writeProblem(w, http.StatusNotFound, CodeNotFound, "Not found", "no such coupon: a coupon id is a positive integer")
		return
	}
	claim, created, err := s.claimCoupon(r.Context(), userFrom(r.Context()), id)
	if err != nil {
		s.answerError(w, r, "claim coupon", err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, claim)
}

func (s *Shop) listClaims(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readQueryTimeout)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, rebind(s.dialect, sqlListClaims), userFrom(r.Context()))
	if err != nil {
		s.readFailed(ctx, w, r, "list claims", err)
		return
	}
	defer rows.Close()
	claims := []Claim{}
	for rows.Next() {
		c, err := scanClaim(rows)
		if err != nil {
			s.readFailed(ctx, w, r, "list claims", err)
			return
		}
		claims = append(claims, c)
	}
	if err := rows.Err(); err != nil {
		s.readFailed(ctx, w, r, "list claims", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"coupons": claims})
}
