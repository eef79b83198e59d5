package idemclient_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// A client posts an order without choosing a key; the gateway in front of
// the service answers the first attempt 503. The transport gives the
// request a key and retries it with that key, and the order is created
// once.
func Example() {
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		log.Fatal(err)
	}
	var orders, attempts atomic.Int32
	keys := make(chan string, 2)
	service := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order_no":"A-1"}`)
	}))
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys <- r.Header.Get("Idempotency-Key")
		if attempts.Add(1) == 1 {
			http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
			return
		}
		service.ServeHTTP(w, r)
	}))
	defer server.Close()

	client := &http.Client{Transport: &idemclient.Transport{}}
	resp, err := client.Post(server.URL+"/orders", "application/json", strings.NewReader(`{"sku":"BOOK-1"}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)

	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", attempts.Load(), "orders:", orders.Load())
	fmt.Println("one key:", <-keys == <-keys)
	// Output:
	// 201 {"order_no":"A-1"}
	// attempts: 2 orders: 1
	// one key: true
}

// A request that has a key keeps it on every attempt; the transport adds
// none. Here PUT is covered too, for a server that guards it with keys.
func ExampleTransport() {
	transport := &idemclient.Transport{
		Methods:      []string{http.MethodPost, http.MethodPatch, http.MethodPut},
		RetryMethods: []string{http.MethodGet}, // retried, without a key
		MaxAttempts:  3,
	}
	client := &http.Client{Transport: transport}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(r.Method, "key:", r.Header.Get("Idempotency-Key"))
	}))
	defer server.Close()

	req, err := http.NewRequest(http.MethodPut, server.URL+"/carts/7", strings.NewReader(`{"items":[]}`))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "cart-7-v3")
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	resp, err = client.Get(server.URL + "/carts/7")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	// Output:
	// PUT key: cart-7-v3
	// GET key:
}
