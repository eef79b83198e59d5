package idemcli

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/memstore"
)

// An API that runs its effect on every request, retries included, and
// answers from an idempotency layer (a replay marked as one) passes every
// check that reads answers alone. Without -effect-url the probe cannot
// tell: its verdict must say so, not a bare PASS; with -effect-url it
// fails.
func TestProbeWithoutEffectSaysItCannotTell(t *testing.T) {
	t.Parallel()
	var effects atomic.Int64
	mw, err := idemhttp.New(&idemhttp.Config{Store: memstore.New(nil)})
	if err != nil {
		t.Fatal(err)
	}
	answer := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /items", func(w http.ResponseWriter, r *http.Request) {
		effects.Add(1) // before the idempotency layer: every request takes effect
		answer.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"count":%d}`, effects.Load())
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	r := runIdem(t, "", "probe", "-d", `{"name":"pen"}`, srv.URL+"/items")
	if effects.Load() <= 8 {
		t.Fatalf("the API took %d effects; the test needs one that repeats them", effects.Load())
	}
	if r.code != 0 || !strings.Contains(r.stdout, "PASS") {
		t.Fatalf("without -effect-url: exit %d; stdout:\n%s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	verdict := r.stdout[strings.LastIndex(r.stdout, "PASS"):]
	if !strings.Contains(verdict, "answers only") || !strings.Contains(verdict, "-effect-url") {
		t.Errorf("the verdict does not say the effect was not checked:\n%s", verdict)
	}

	r = runIdem(t, "", "probe", "-d", `{"name":"pen"}`, "-effect-url", srv.URL+"/count", "-effect-json-path", "count", srv.URL+"/items")
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL") || strings.Contains(r.stdout, "answers only") {
		t.Fatalf("with -effect-url: exit %d; stdout:\n%s", r.code, r.stdout)
	}
}
