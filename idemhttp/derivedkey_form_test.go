package idemhttp_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// formCallback is a form-encoded notification, as many payment providers
// send them.
func formCallback(target, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return r
}

// A Key that parses the form (r.FormValue, r.PostFormValue) reads the
// request body: it gets the body, and what it parses does not leak into
// the handler's request, whose form holds the whole body.
func TestKeyFromForm(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		key    func(*http.Request, []byte) (string, error)
		target string
		want   string
	}{
		{"body", func(r *http.Request, _ []byte) (string, error) { return r.PostFormValue("out_trade_no"), nil },
			"/callbacks/pay", "T-1"},
		{"query", func(r *http.Request, _ []byte) (string, error) { return r.FormValue("notify_id"), nil },
			"/callbacks/pay?notify_id=N-1", "N-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				mu      sync.Mutex
				amounts []string
			)
			e := setup(t, &idemhttp.Config{Key: tc.key}, func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				amounts = append(amounts, r.PostFormValue("total_amount"))
				mu.Unlock()
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write([]byte("success"))
			})
			const body = "out_trade_no=T-1&total_amount=19.99"
			first := e.Serve(formCallback(tc.target, body))
			if first.Code != http.StatusOK || first.Body.String() != "success" {
				t.Fatalf("first: %d %s", first.Code, first.Body)
			}
			if rec := e.Record("", tc.want); rec.Response == nil || rec.Response.StatusCode != http.StatusOK {
				t.Fatalf("record under %s: %+v", tc.want, rec)
			}
			again := e.Serve(formCallback(tc.target, body))
			if again.Code != http.StatusOK || again.Header().Get(idemhttp.HeaderReplayed) != "true" {
				t.Fatalf("retry: %d %v %s", again.Code, again.Header(), again.Body)
			}
			e.WantCalls(1)
			if len(amounts) != 1 || amounts[0] != "19.99" {
				t.Errorf("the handler read total_amount %q, want [19.99]", amounts)
			}
		})
	}
}

// The pattern Config.Key's documentation asks for: Key verifies the
// provider's signature, so a forged notification that carries a genuine
// trade number makes no record, and the genuine one runs.
func TestKeyVerifiesSignature(t *testing.T) {
	t.Parallel()
	secret := []byte("provider secret")
	sign := func(body string) string {
		h := hmac.New(sha256.New, secret)
		h.Write([]byte(body))
		return hex.EncodeToString(h.Sum(nil))
	}
	e := setup(t, &idemhttp.Config{Key: func(r *http.Request, body []byte) (string, error) {
		got, err := hex.DecodeString(r.Header.Get("X-Signature"))
		h := hmac.New(sha256.New, secret)
		h.Write(body)
		if err != nil || !hmac.Equal(got, h.Sum(nil)) {
			return "", errors.New("bad signature")
		}
		return tradeNo(r, body)
	}}, nil)
	const genuine = `{"trade_no":"T-9","amount":1999}`
	forged := `{"trade_no":"T-9","amount":1}`
	wantProblem(t, e.Serve(callback(forged, "X-Signature", sign(genuine))), http.StatusBadRequest, idemhttp.CodeInvalidKey)
	e.NoRecord("", "T-9")
	e.WantCalls(0)
	if w := e.Serve(callback(genuine, "X-Signature", sign(genuine))); w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("genuine notification: %d %s", w.Code, w.Body)
	}
	e.WantCalls(1)
	if rec := e.Record("", "T-9"); rec.Response == nil || rec.Response.StatusCode != http.StatusCreated {
		t.Fatalf("record: %+v", rec)
	}
}
