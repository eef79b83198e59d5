package idemhttp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// post sends a POST with an Idempotency-Key to h and prints the answer.
func post(h http.Handler, target, key, body string) {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Printf("%d %s replayed=%q\n", w.Code, strings.TrimSpace(w.Body.String()), w.Header().Get("Idempotent-Replayed"))
}

// The quick start: guard a route, and a retry with the same key gets the
// first answer without running the handler again.
func ExampleNew() {
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		log.Fatal(err)
	}
	orders := 0
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orders)
	})))

	post(mux, "/orders", "8e03978e-40d5-43e8", `{"sku":"A-1"}`)
	post(mux, "/orders", "8e03978e-40d5-43e8", `{ "sku": "A-1" }`) // a retry
	post(mux, "/orders", "8e03978e-40d5-43e8", `{"sku":"B-2"}`)    // the key reused for another request
	// Output:
	// 201 {"order":1} replayed=""
	// 201 {"order":1} replayed="true"
	// 422 {"type":"https://github.com/idemkit/idem/blob/main/idemhttp/PROBLEMS.md#key_mismatch","title":"Idempotency key reused","status":422,"detail":"this Idempotency-Key was used with a different request; use a new key for a new request","code":"KEY_MISMATCH"} replayed=""
}

// Handler wraps any http.Handler; requests with uncovered methods (here
// GET) pass through untouched.
func ExampleMiddleware_Handler() {
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		log.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s guarded=%v", r.Method, idemhttp.ExecutionFrom(r.Context()) != nil)
	}))
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		r := httptest.NewRequest(method, "/things", nil)
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body)
	}
	// Output:
	// 200 GET guarded=false
	// 200 POST guarded=true
}

// With derives per-route options: here a route whose retries wait for the
// first request instead of getting 409 PROCESSING.
func ExampleMiddleware_With() {
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		log.Fatal(err)
	}
	waiting, err := mw.With(func(c *idemhttp.Config) { c.Wait = 5 * time.Second })
	if err != nil {
		log.Fatal(err)
	}
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", waiting.Handler(slow))
	mux.Handle("POST /refunds", mw.Handler(slow))

	send := func(target string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "key-for"+target)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	for _, target := range []string{"/payments", "/refunds"} {
		first := make(chan *httptest.ResponseRecorder)
		go func() { first <- send(target) }()
		time.Sleep(10 * time.Millisecond) // the retry arrives while the first runs
		retry := send(target)
		fmt.Println(target, "first:", (<-first).Code, "retry:", retry.Code, retry.Header().Values("Retry-After"))
	}
	// Output:
	// /payments first: 201 retry: 201 []
	// /refunds first: 201 retry: 409 [1]
}

func ExampleFingerprintV1() {
	fp := func(target, body string) string {
		r := httptest.NewRequest(http.MethodPost, target, nil)
		r.Header.Set("Content-Type", "application/json")
		f, _ := idemhttp.FingerprintV1(r, []byte(body))
		return string(f)
	}
	a := fp("/orders?b=2&a=1", `{"sku":"A-1","quantity":2}`)
	b := fp("/orders?a=1&b=2", "{\n  \"quantity\": 2,\n  \"sku\": \"A-1\"\n}")
	c := fp("/orders?a=1&b=2", `{"sku":"A-1","quantity":3}`)
	fmt.Println(a[:3], len(a))
	fmt.Println("reordered and reformatted:", a == b)
	fmt.Println("another quantity:", a == c)
	// Output:
	// v1: 67
	// reordered and reformatted: true
	// another quantity: false
}

func ExampleCanonicalJSON() {
	out, err := idemhttp.CanonicalJSON(nil, []byte(`{ "b": [1, 2.50], "a": "\u00e9\/", "c": {"y": null, "x": true} }`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(out))
	// Output:
	// {"a":"é/","b":[1,2.50],"c":{"x":true,"y":null}}
}

func ExampleParseKey() {
	for _, header := range []string{`8e03978e-40d5`, `"order \"42\""`, `"bad\escape"`} {
		key, err := idemhttp.ParseKey(header)
		fmt.Printf("%q %v\n", key, err)
	}
	// Output:
	// "8e03978e-40d5" <nil>
	// "order \"42\"" <nil>
	// "" idem: invalid key: quoted key has the escape \e; only \" and \\ are allowed
}

func ExampleWriteProblem() {
	w := httptest.NewRecorder()
	idemhttp.WriteProblem(w, http.StatusConflict, "OUT_OF_STOCK", "Out of stock", "sku A-1 is sold out")
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	fmt.Println(w.Body)
	// Output:
	// 409 application/problem+json
	// {"type":"about:blank","title":"Out of stock","status":409,"detail":"sku A-1 is sold out","code":"OUT_OF_STOCK"}
}

func ExampleWriteResponse() {
	resp, err := idemhttp.JSONResponse(http.StatusCreated, map[string]string{"id": "o-1"})
	if err != nil {
		log.Fatal(err)
	}
	w := httptest.NewRecorder()
	idemhttp.WriteResponse(w, resp)
	fmt.Println(w.Code, w.Header().Get("Content-Type"), w.Body)
	// Output:
	// 201 application/json {"id":"o-1"}
}

// A Scope function keys records by the authenticated caller; a ScopeError
// chooses the answer when there is none.
func ExampleScopeError() {
	type userKey struct{}
	scope := func(r *http.Request) (string, error) {
		user, _ := r.Context().Value(userKey{}).(string)
		if user == "" {
			return "", &idemhttp.ScopeError{Status: http.StatusForbidden, Code: "NO_ACCOUNT", Detail: "sign in first",
				Err: errors.New("no user in context")}
		}
		return "user:" + user, nil
	}
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil), Scope: scope})
	if err != nil {
		log.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	post(h, "/orders", "k", `{}`)
	// Output:
	// 403 {"type":"about:blank","title":"Forbidden","status":403,"detail":"sign in first","code":"NO_ACCOUNT"} replayed=""
}

// A payment provider's notifications carry no Idempotency-Key: Config.Key
// takes the key from the body's trade_no, so the provider's retries are
// replays and the payment is recorded once.
func ExampleConfig_key() {
	mw, err := idemhttp.New(&idemhttp.Config{
		Store: memstore.New(nil),
		Key: func(r *http.Request, body []byte) (string, error) {
			var n struct {
				TradeNo string `json:"trade_no"`
			}
			if err := json.Unmarshal(body, &n); err != nil {
				return "", err
			}
			return n.TradeNo, nil // "" is answered 400 MISSING_KEY
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	payments := 0
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments++
		fmt.Fprintf(w, "success %d", payments)
	}))
	for _, body := range []string{
		`{"trade_no":"T-1001","amount":1999}`,
		`{"trade_no":"T-1001","amount":1999}`, // the provider's retry
		`{"amount":1999}`,
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/callbacks/pay", strings.NewReader(body)))
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.SplitN(w.Body.String(), ",", 2)[0])
	}
	// Output:
	// 200  success 1
	// 200 true success 1
	// 400  {"type":"https://github.com/idemkit/idem/blob/main/idemhttp/PROBLEMS.md#missing_key"
}

// An upload route spools large bodies to a temporary file instead of
// holding them in memory: the body is hashed as it is read, so a retry of
// the same upload replays and one with other bytes is refused, and the
// handler reads the body as a stream.
func ExampleConfig_spoolBody() {
	mw, err := idemhttp.New(&idemhttp.Config{
		Store:           memstore.New(nil),
		SpoolBody:       true,     // bodies over MaxRequestBody (1 MiB) go to os.TempDir()
		MaxStreamedBody: 64 << 20, // refuse more than 64 MiB with 413
	})
	if err != nil {
		log.Fatal(err)
	}
	uploads := 0
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uploads++
		n, _ := io.Copy(io.Discard, r.Body) // a stream: memory part, then the spool file
		fmt.Fprintf(w, "upload %d: %d bytes", uploads, n)
	}))
	for _, fill := range []string{"a", "a", "b"} {
		r := httptest.NewRequest(http.MethodPost, "/uploads", strings.NewReader(strings.Repeat(fill, 3<<20)))
		r.Header.Set("Content-Type", "application/octet-stream")
		r.Header.Set("Idempotency-Key", "upload-7")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.SplitN(w.Body.String(), ",", 2)[0])
	}
	// Output:
	// 200  upload 1: 3145728 bytes
	// 200 true upload 1: 3145728 bytes
	// 422  {"type":"https://github.com/idemkit/idem/blob/main/idemhttp/PROBLEMS.md#key_mismatch"
}
