package idemhttp_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
)

// tradeNo is a Config.Key that takes the key from the JSON body's
// trade_no member, as a payment provider's notification carries it.
func tradeNo(_ *http.Request, body []byte) (string, error) {
	var n struct {
		TradeNo string `json:"trade_no"`
	}
	if err := json.Unmarshal(body, &n); err != nil {
		return "", err
	}
	return n.TradeNo, nil
}

// eventID is a Config.Key that takes the key from a provider's header.
func eventID(r *http.Request, _ []byte) (string, error) {
	return r.Header.Get("X-Provider-Event-Id"), nil
}

// callback returns a notification request: no Idempotency-Key.
func callback(body string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/callbacks/pay", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

func TestKeyFromBody(t *testing.T) {
	t.Parallel()
	var handlerBody string
	e := setup(t, &idemhttp.Config{Key: tradeNo}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		handlerBody = string(b)
		echoHandler(w, r)
	})
	const body = `{"trade_no":"T-2024-0001","amount":1999}`
	first := e.Serve(callback(body))
	if first.Code != http.StatusCreated || handlerBody != body {
		t.Fatalf("first: %d %s; the handler read %q", first.Code, first.Body, handlerBody)
	}
	rec := e.Record("", "T-2024-0001")
	if rec.Response == nil || rec.Response.StatusCode != http.StatusCreated {
		t.Fatalf("record under the trade number: %+v", rec)
	}
	// The same notification, reformatted and with an Idempotency-Key
	// header that the route ignores: a replay.
	r := callback(`{ "amount": 1999, "trade_no": "T-2024-0001" }`, "Idempotency-Key", "ignored")
	again := e.Serve(r)
	if again.Code != http.StatusCreated || again.Header().Get(idemhttp.HeaderReplayed) != "true" || again.Body.String() != first.Body.String() {
		t.Fatalf("replay: %d %v %s", again.Code, again.Header(), again.Body)
	}
	e.NoRecord("", "ignored")
	e.WantCalls(1)

	// The same trade number with another amount: 422.
	wantProblem(t, e.Serve(callback(`{"trade_no":"T-2024-0001","amount":1}`)), http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
	e.WantCalls(1)
}

func TestKeyFromHeader(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemhttp.Config{Key: eventID}, nil)
	first := e.Serve(callback(`{"paid":true}`, "X-Provider-Event-Id", "evt_1"))
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	again := e.Serve(callback(`{"paid":true}`, "X-Provider-Event-Id", "evt_1"))
	if again.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %v", again.Code, again.Header())
	}
	if other := e.Serve(callback(`{"paid":true}`, "X-Provider-Event-Id", "evt_2")); other.Code != http.StatusCreated || other.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatalf("another event: %d %v", other.Code, other.Header())
	}
	e.WantCalls(2)
	e.Record("", "evt_1")
	e.Record("", "evt_2")
}

func TestKeyRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t, &idemhttp.Config{Key: tradeNo}, nil)
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"not JSON", `trade_no=1`, http.StatusBadRequest, idemhttp.CodeInvalidKey},
		{"no trade_no", `{"amount":1}`, http.StatusBadRequest, idemhttp.CodeMissingKey},
		{"empty trade_no", `{"trade_no":""}`, http.StatusBadRequest, idemhttp.CodeMissingKey},
		{"control character", `{"trade_no":"T\n1"}`, http.StatusBadRequest, idemhttp.CodeInvalidKey},
		{"too long", `{"trade_no":"` + strings.Repeat("x", 256) + `"}`, http.StatusBadRequest, idemhttp.CodeInvalidKey},
	} {
		p := wantProblem(t, e.Serve(callback(tc.body)), tc.status, tc.code)
		if tc.name == "not JSON" && strings.Contains(p.Detail, "invalid character") {
			t.Errorf("%s: the detail shows Key's error: %q", tc.name, p.Detail)
		}
	}
	e.WantCalls(0)

	// Key's error never reaches the client; a too-large body is refused
	// before Key runs.
	called := false
	e2 := setup(t, &idemhttp.Config{MaxRequestBody: 8, Key: func(*http.Request, []byte) (string, error) {
		called = true
		return "", errors.New("secret detail")
	}}, nil)
	wantProblem(t, e2.Serve(callback(`{"trade_no":"T-1","pad":"............"}`)), http.StatusRequestEntityTooLarge, idemhttp.CodeBodyTooLarge)
	if called {
		t.Error("Key ran on a body over the limit")
	}
	p := wantProblem(t, e2.Serve(callback(`{}`)), http.StatusBadRequest, idemhttp.CodeInvalidKey)
	if strings.Contains(p.Detail, "secret") {
		t.Errorf("the detail shows Key's error: %q", p.Detail)
	}

	// KeyOptional: no key runs the handler unguarded, with the whole body.
	var got string
	e3 := setup(t, &idemhttp.Config{Key: tradeNo, KeyOptional: true}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.WriteHeader(http.StatusNoContent)
	})
	for range 2 {
		if w := e3.Serve(callback(`{"amount":3}`)); w.Code != http.StatusNoContent || got != `{"amount":3}` {
			t.Fatalf("KeyOptional without a key: %d, the handler read %q", w.Code, got)
		}
	}
	e3.WantCalls(2)
}

// TestKeyConcurrentCallbacks: 30 identical notifications at once run the
// handler once. The handler holds the first until the 29 others have been
// answered 409 PROCESSING; a later one is a replay.
func TestKeyConcurrentCallbacks(t *testing.T) {
	t.Parallel()
	const n = 30
	answered := make(chan struct{}, n)
	e := setup(t, &idemhttp.Config{Key: tradeNo}, func(w http.ResponseWriter, r *http.Request) {
		timeout := time.After(10 * time.Second)
		for range n - 1 {
			select {
			case <-answered:
			case <-timeout: // the counts below fail
			}
		}
		echoHandler(w, r)
	})
	var wg sync.WaitGroup
	responses := make([]*httptest.ResponseRecorder, n)
	for i := range n {
		wg.Go(func() {
			responses[i] = e.Serve(callback(`{"trade_no":"T-race","amount":5}`))
			answered <- struct{}{}
		})
	}
	wg.Wait()
	e.WantCalls(1)
	var created, processing int
	for _, w := range responses {
		switch w.Code {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			wantProblem(t, w, http.StatusConflict, idemhttp.CodeProcessing)
			processing++
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	if created != 1 || processing != n-1 {
		t.Fatalf("%d created, %d processing; want 1 and %d", created, processing, n-1)
	}
	if w := e.Serve(callback(`{"amount":5,"trade_no":"T-race"}`)); w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("a later notification: %d %v", w.Code, w.Header())
	}
	e.WantCalls(1)
}

// A Config.Scope that parses the form (the tenant in the query string, read
// with r.FormValue) must not drain a form body: the fingerprint and the
// handler still see every byte, so two different forms under one key are a
// mismatch, not a replay of each other.
func TestScopeCannotDrainBody(t *testing.T) {
	t.Parallel()
	var handlerBody, handlerAmount string
	var scopeRead error
	e := setup(t, &idemhttp.Config{Scope: func(r *http.Request) (string, error) {
		_, scopeRead = io.ReadAll(r.Body)
		return "tenant:" + r.FormValue("tenant"), nil
	}}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		handlerBody = string(b)
		r.Body = io.NopCloser(strings.NewReader(handlerBody))
		handlerAmount = r.PostFormValue("amount")
		echoHandler(w, r)
	})
	form := func(amount string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/pay?tenant=t1", strings.NewReader("amount="+amount))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Idempotency-Key", "k1")
		return r
	}
	if rec := e.Serve(form("100")); rec.Code != http.StatusCreated || handlerBody != "amount=100" || handlerAmount != "100" {
		t.Fatalf("first: %d; the handler read %q (amount %q)", rec.Code, handlerBody, handlerAmount)
	}
	if scopeRead == nil {
		t.Error("Scope read the body without an error")
	}
	if rec := e.Record("tenant:t1", "k1"); rec.Response == nil {
		t.Fatalf("no record under the scope the query named: %+v", rec)
	}
	wantProblem(t, e.Serve(form("999")), http.StatusUnprocessableEntity, idemhttp.CodeKeyMismatch)
	e.WantCalls(1)
}
