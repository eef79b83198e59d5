//go:build linux

package pgfailover

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/sqlstore"
)

// lease is the middleware's lease: short, so that a request the kill
// interrupted is taken over soon on the promoted server.
const lease = 2 * time.Second

// rig is the program under test: the idemhttp middleware over sqlstore
// on whichever server accepts writes, and a handler whose effect is a row
// of failover_effects, committed with the stored response. The table has
// no unique constraint on the key: a doubled effect is two rows.
type rig struct {
	db    *sql.DB
	store *sqlstore.Store
	srv   *httptest.Server

	mu   sync.Mutex
	runs map[string]int // handler executions per key
	// unsure holds, by key, the effect ids of executions whose commit
	// failed: the server may have committed it before it died.
	unsure map[string][]int64

	failed atomic.Int64 // executions that answered 500 (their transaction failed)
}

// answer is the handler's response body.
type answer struct {
	Key    string `json:"key"`
	Effect int64  `json:"effect"` // the effect row's id
}

func newRig(t *testing.T, url string) *rig {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(40)
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), serverWait)
	defer cancel()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE failover_effects (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	rg := &rig{db: db, store: store, runs: map[string]int{}, unsure: map[string][]int64{}}
	rg.srv = httptest.NewServer(mw.Handler(http.HandlerFunc(rg.effect)))
	t.Cleanup(rg.srv.Close)
	return rg
}

// effect is the guarded handler: one row, and the record's completion in
// the same transaction.
func (rg *rig) effect(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	rg.mu.Lock()
	rg.runs[key]++
	rg.mu.Unlock()
	fail := func() {
		rg.failed.Add(1)
		idemhttp.WriteProblem(w, http.StatusInternalServerError, "INTERNAL", "", "retry with the same key")
	}
	tx, err := rg.db.BeginTx(ctx, nil)
	if err != nil {
		fail()
		return
	}
	defer tx.Rollback() // a no-op after Commit
	var id int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO failover_effects (key) VALUES ($1) RETURNING id`, key).Scan(&id); err != nil {
		fail()
		return
	}
	resp, err := idemhttp.JSONResponse(http.StatusCreated, answer{Key: key, Effect: id})
	if err != nil {
		fail()
		return
	}
	if err := idemhttp.ExecutionFrom(ctx).CompleteTx(ctx, tx, resp); err != nil {
		fail()
		return
	}
	if err := tx.Commit(); err != nil {
		rg.mu.Lock()
		rg.unsure[key] = append(rg.unsure[key], id)
		rg.mu.Unlock()
		fail()
		return
	}
	idemhttp.WriteResponse(w, resp)
}

// ran returns how many times the handler ran for key.
func (rg *rig) ran(key string) int {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return rg.runs[key]
}

// executions returns the handler's executions in all.
func (rg *rig) executions() int {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	n := 0
	for _, r := range rg.runs {
		n += r
	}
	return n
}

// reply is one answer of the middleware.
type reply struct {
	status   int
	body     string
	replayed bool
}

var client = &http.Client{Timeout: 30 * time.Second}

// post sends key's request once.
func (rg *rig) post(ctx context.Context, key string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rg.srv.URL+"/effects", strings.NewReader(fmt.Sprintf(`{"key":%q}`, key)))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, body: string(body), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}

// tally counts what clients saw.
type tally struct {
	requests, connErrors atomic.Int64
	mu                   sync.Mutex
	statuses             map[int]int
}

func (ty *tally) saw(status int) {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	if ty.statuses == nil {
		ty.statuses = map[int]int{}
	}
	ty.statuses[status]++
}

// failures counts the answers that say the server failed (500, 503) and
// the requests with no answer.
func (ty *tally) failures() int64 {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	return int64(ty.statuses[http.StatusInternalServerError]+ty.statuses[http.StatusServiceUnavailable]) + ty.connErrors.Load()
}

func (ty *tally) String() string {
	ty.mu.Lock()
	defer ty.mu.Unlock()
	return fmt.Sprintf("%d requests, answers by status %v, %d with no answer", ty.requests.Load(), ty.statuses, ty.connErrors.Load())
}

// untilAnswered sends key's request, the same key and body each time,
// until it gets a definite answer (2xx): through connection errors, 500,
// 503 and 409 PROCESSING, as a retrying client does. Any other answer, or
// none before ctx ends, is an error.
func (rg *rig) untilAnswered(ctx context.Context, key string, ty *tally) (reply, error) {
	var last string
	for {
		ty.requests.Add(1)
		rp, err := rg.post(ctx, key)
		switch {
		case err != nil:
			ty.connErrors.Add(1)
			last = err.Error()
		case rp.status >= 200 && rp.status < 300:
			ty.saw(rp.status)
			return rp, nil
		case rp.status == http.StatusConflict || rp.status == http.StatusInternalServerError || rp.status == http.StatusServiceUnavailable:
			ty.saw(rp.status)
			last = fmt.Sprintf("%d %s", rp.status, rp.body)
		default:
			ty.saw(rp.status)
			return rp, fmt.Errorf("key %s: answered %d %s", key, rp.status, rp.body)
		}
		select {
		case <-ctx.Done():
			return reply{}, fmt.Errorf("key %s: no definite answer before the deadline; last: %s", key, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// effects reads failover_effects on a server: the effect rows' ids by key.
func effects(t *testing.T, n *node) map[string][]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), serverWait)
	defer cancel()
	rows, err := n.admin.QueryContext(ctx, `SELECT key, id FROM failover_effects ORDER BY id`)
	if err != nil {
		t.Fatalf("server %s: %v", n.name, err)
	}
	defer rows.Close()
	m := map[string][]int64{}
	for rows.Next() {
		var key string
		var id int64
		if err := rows.Scan(&key, &id); err != nil {
			t.Fatal(err)
		}
		m[key] = append(m[key], id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// effectOf decodes an answer's effect row id.
func effectOf(t *testing.T, body string) int64 {
	t.Helper()
	var a answer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	return a.Effect
}
