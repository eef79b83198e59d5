package idemhttp_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/httpharness"
	"github.com/idemkit/idem/memstore"
)

// TestReplayFiltersStoredHeaders checks that a replay sends only the
// replayable headers of a record, whoever wrote it: a record that holds
// Set-Cookie or Authorization (stored by an earlier version, whose
// CompleteTx path did not filter, or by another writer of the store)
// must not hand them to the client of a retry.
func TestReplayFiltersStoredHeaders(t *testing.T) {
	t.Parallel()
	store := memstore.New(nil)
	e := setup(t, &idemhttp.Config{Store: store}, nil)
	const key = "stored-by-another-writer"
	r := request(http.MethodPost, "/orders", key, `{"sku":"a"}`)
	fp, err := idemhttp.FingerprintV1(r, []byte(`{"sku":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	// A guard without the middleware's filter stores the response whole.
	g, err := idem.NewGuard(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	exec, res, err := g.Begin(t.Context(), "", key, fp)
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatalf("Begin = %v, %v", res.Outcome, err)
	}
	if err := exec.Complete(t.Context(), idem.Response{StatusCode: 201, Header: map[string][]string{
		"Content-Type":  {"application/json"},
		"Set-Cookie":    {"session=secret"},
		"Authorization": {"Bearer secret"},
		"X-Internal":    {"not replayable"},
	}, Body: []byte(`{"id":1}`)}); err != nil {
		t.Fatal(err)
	}

	w := e.Serve(r)
	e.WantCalls(0)
	if w.Code != 201 || w.Header().Get(idemhttp.HeaderReplayed) != "true" || w.Body.String() != `{"id":1}` {
		t.Fatalf("replay = %d %q %q, want the stored 201", w.Code, w.Header(), w.Body)
	}
	if got := w.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("replayed Content-Type = %q", got)
	}
	for _, name := range []string{"Set-Cookie", "Authorization", "X-Internal"} {
		if v, ok := w.Header()[name]; ok {
			t.Errorf("replay sent the stored %s: %q", name, v)
		}
	}
}

// A response a handler stores itself with Complete goes through the same
// filter as a recorded one: only replayable headers are kept, and a body
// over MaxResponseBody is omitted. (sqlstore's test of the same name
// checks the CompleteTx path on SQLite.)
func TestHandlerCompletionFiltered(t *testing.T) {
	t.Parallel()
	t.Run("Complete", func(t *testing.T) {
		t.Parallel()
		e := setup(t, &idemhttp.Config{MaxResponseBody: 64}, func(w http.ResponseWriter, r *http.Request) {
			resp := httpharness.UnfilteredResponse()
			if err := idemhttp.ExecutionFrom(r.Context()).Complete(r.Context(), resp); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			idemhttp.WriteResponse(w, resp)
		})
		httpharness.CheckCompletionFiltered(t, e)
	})
}
