package shop_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// claimCoupon posts a claim of coupon id as user and decodes the answer.
func claimCoupon(t *testing.T, s http.Handler, user int64, id string) (int, shop.Claim, string) {
	t.Helper()
	rec := serve(s, "POST", "/coupons/"+id+"/claim", map[string]string{"X-User-ID": strconv.FormatInt(user, 10)}, "")
	if rec.Code != http.StatusCreated && rec.Code != http.StatusOK {
		return rec.Code, shop.Claim{}, problemCode(t, rec)
	}
	var c shop.Claim
	if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
		t.Fatalf("claim body %s: %v", rec.Body, err)
	}
	return rec.Code, c, ""
}

// A claim is made once per user and coupon: 201 the first time, 200 with
// the same claim afterwards (USED once an order used it), and only the
// first takes one of the coupon's total; none left is 409 COUPON_SOLD_OUT
// and leaves no claim row; an unknown coupon is 404.
func TestClaimCoupon(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := shop.DefaultCatalog()
		c.Coupons = append(c.Coupons, shop.Coupon{ID: 2, Name: "last one", DiscountCents: 100, Total: 1})
		s, db := newShopWith(t, b, c)

		status, first, _ := claimCoupon(t, s, 7, "1")
		if status != 201 || first.ClaimID == 0 || first.CouponID != 1 || first.UserID != 7 || first.Status != "UNUSED" || first.OrderNo != "" {
			t.Fatalf("first claim: %d %+v", status, first)
		}
		rec := serve(s, "POST", "/coupons/1/claim", map[string]string{"X-User-ID": "7"}, "")
		if rec.Code != 200 || rec.Body.String() != `{"claim_id":`+strconv.FormatInt(first.ClaimID, 10)+`,"coupon_id":1,"user_id":7,"status":"UNUSED"}` {
			t.Fatalf("second claim: %d %s", rec.Code, rec.Body)
		}
		if n := countRows(t, db, `SELECT claimed FROM shop_coupons WHERE id = 1`); n != 1 {
			t.Fatalf("coupon 1 claimed %d times, want 1", n)
		}

		// Used by an order: claiming again answers the same claim, USED.
		_, o, code := postOrder(t, s, 7, "with-coupon", `{"sku":"SKU-1","quantity":1,"coupon_id":1}`)
		if code != "" || o.AmountCents != 1299-500 {
			t.Fatalf("order with the claim: %s %+v", code, o)
		}
		if status, again, _ := claimCoupon(t, s, 7, "1"); status != 200 || again.ClaimID != first.ClaimID || again.Status != "USED" || again.OrderNo != o.OrderNo {
			t.Fatalf("claim after use: %d %+v, want 200 USED by %s", status, again, o.OrderNo)
		}
		if n := countRows(t, db, `SELECT claimed FROM shop_coupons WHERE id = 1`); n != 1 {
			t.Fatalf("coupon 1 claimed %d times, want 1", n)
		}

		// The caller's claims, and no one else's.
		rec = serve(s, "GET", "/users/me/coupons", map[string]string{"X-User-ID": "7"}, "")
		var list struct{ Coupons []shop.Claim }
		if err := json.Unmarshal(rec.Body.Bytes(), &list); rec.Code != 200 || err != nil || len(list.Coupons) != 1 || list.Coupons[0].ClaimID != first.ClaimID || list.Coupons[0].Status != "USED" {
			t.Fatalf("GET /users/me/coupons: %d %s", rec.Code, rec.Body)
		}
		rec = serve(s, "GET", "/users/me/coupons", map[string]string{"X-User-ID": "8"}, "")
		if rec.Code != 200 || rec.Body.String() != `{"coupons":[]}` {
			t.Fatalf("another user's list: %d %s", rec.Code, rec.Body)
		}
		if rec = serve(s, "GET", "/users/me/coupons", nil, ""); rec.Code != 401 {
			t.Fatalf("list without a user: %d", rec.Code)
		}

		// The last one of coupon 2.
		if status, _, _ := claimCoupon(t, s, 7, "2"); status != 201 {
			t.Fatalf("claim of the last coupon 2: %d", status)
		}
		if status, _, code := claimCoupon(t, s, 8, "2"); status != 409 || code != "COUPON_SOLD_OUT" {
			t.Fatalf("claim of a sold-out coupon: %d %s", status, code)
		}
		if status, _, _ := claimCoupon(t, s, 7, "2"); status != 200 {
			t.Fatalf("the holder's repeated claim of a sold-out coupon: %d, want 200", status)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM shop_coupon_claims WHERE coupon_id = 2`); n != 1 {
			t.Fatalf("%d claim rows of coupon 2, want 1", n)
		}

		for _, id := range []string{"99", "0", "-1", "01", "x", "99999999999999999999"} {
			if status, _, code := claimCoupon(t, s, 7, id); status != 404 || code != "NOT_FOUND" {
				t.Errorf("claim of coupon %q: %d %s, want 404 NOT_FOUND", id, status, code)
			}
		}
		if rec := serve(s, "POST", "/coupons/1/claim", nil, ""); rec.Code != 401 {
			t.Errorf("claim without a user: %d", rec.Code)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM shop_coupon_claims`); n != 2 {
			t.Fatalf("%d claim rows, want 2", n)
		}
	})
}

// 300 concurrent claims of coupon 1 (100 in total) from 150 users, two
// each: exactly 100 claim rows, none twice for a user, claimed = 100;
// each user who got one got 201 once and 200 with the same claim; the
// others got 409 COUPON_SOLD_OUT.
func TestConcurrentClaims(t *testing.T) {
	forIsolations(t, func(t *testing.T, b backend) {
		s, db := newShop(t, b)
		const users, each = 150, 2
		type answer struct {
			status int
			claim  shop.Claim
			code   string
		}
		answers := make([]answer, users*each)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range answers {
			wg.Go(func() {
				<-start
				var a answer
				a.status, a.claim, a.code = claimCoupon(t, s, int64(i%users+1), "1")
				answers[i] = a
			})
		}
		close(start)
		wg.Wait()
		created, winners := 0, 0
		for u := range users {
			a, b := answers[u], answers[u+users] // the user's two claims
			switch {
			case a.status == 409 && b.status == 409:
				if a.code != "COUPON_SOLD_OUT" || b.code != "COUPON_SOLD_OUT" {
					t.Errorf("user %d: %s and %s", u+1, a.code, b.code)
				}
			case a.status == 201 && b.status == 200, a.status == 200 && b.status == 201:
				winners++
				if a.claim.ClaimID != b.claim.ClaimID || a.claim.UserID != int64(u+1) {
					t.Errorf("user %d got two claims: %+v and %+v", u+1, a.claim, b.claim)
				}
			default:
				t.Errorf("user %d: %d %s and %d %s", u+1, a.status, a.code, b.status, b.code)
			}
			for _, x := range []answer{a, b} {
				if x.status == 201 {
					created++
				}
			}
		}
		if created != 100 || winners != 100 {
			t.Errorf("%d claims created, %d users with a claim; want 100 and 100", created, winners)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM shop_coupon_claims WHERE coupon_id = 1`); n != 100 {
			t.Errorf("%d claim rows, want 100", n)
		}
		if n := countRows(t, db, `SELECT COUNT(*) FROM (SELECT user_id FROM shop_coupon_claims GROUP BY user_id HAVING COUNT(*) > 1) twice`); n != 0 {
			t.Errorf("%d users with two claims", n)
		}
		if n := countRows(t, db, `SELECT claimed FROM shop_coupons WHERE id = 1`); n != 100 {
			t.Errorf("claimed = %d, want 100", n)
		}
	})
}
