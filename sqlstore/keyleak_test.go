package sqlstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// errTexts is an Observer that keeps the text of every error it is told.
type errTexts struct {
	mu    sync.Mutex
	texts []string
}

func (o *errTexts) Start(ctx context.Context, _ idem.Event) context.Context { return ctx }

func (o *errTexts) End(_ context.Context, e idem.Event) {
	if e.Err != nil {
		o.mu.Lock()
		o.texts = append(o.texts, e.Err.Error())
		o.mu.Unlock()
	}
}

// TestMalformedRecordErrorsHideTheKey: a record the store cannot read (a
// header it cannot decode) is an error that
// reaches logs and spans: it names the record by its idem.HashKey, never
// by its scope and key, which the operator did not opt in to log.
func TestMalformedRecordErrorsHideTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const scope, key = "user-4242", "secret-key-Zq81"
	hash := idem.HashKey(scope, key)
	for _, corrupt := range []string{
		`UPDATE idem_records SET response_header = 'not a header'`,
	} {
		db, s := setup(t)
		res, err := s.Acquire(ctx, idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Acquire: %+v, %v", res, err)
		}
		if err := s.Complete(ctx, res.Lease, idem.Response{StatusCode: 201, Header: http.Header{"X": {"y"}}}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, corrupt); err != nil {
			t.Fatalf("%s: %v", corrupt, err)
		}
		_, err = s.Get(ctx, scope, key)
		if err == nil || errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("%s: Get = %v, want an error", corrupt, err)
		}
		if strings.Contains(err.Error(), key) || strings.Contains(err.Error(), scope) || !strings.Contains(err.Error(), hash) {
			t.Errorf("%s: Get's error %q shows the key, or not its hash %s", corrupt, err, hash)
		}

		// Through the middleware: its logs (at every level) and the
		// errors its Observer hears.
		var logs bytes.Buffer
		obs := &errTexts{}
		mw, err := idemhttp.New(&idemhttp.Config{Store: s, Observer: obs, StoreName: "sqlite",
			Scope:  func(*http.Request) (string, error) { return scope, nil },
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("%s: status %d, want 503", corrupt, w.Code)
		}
		obs.mu.Lock()
		texts := strings.Join(obs.texts, "\n")
		obs.mu.Unlock()
		if texts == "" || logs.Len() == 0 {
			t.Fatalf("%s: nothing reported (errors %q, logs %q)", corrupt, texts, logs.String())
		}
		for what, s := range map[string]string{"the observed errors": texts, "the logs": logs.String(), "the response": w.Body.String()} {
			if strings.Contains(s, key) || strings.Contains(s, scope) {
				t.Errorf("%s: %s show the key: %s", corrupt, what, s)
			}
		}
	}
}
