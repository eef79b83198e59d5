package sentinelfail

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/redisstore"
)

// variants are the two stores each test runs: plain redisstore, and one
// that waits for a replica after each record write.
var variants = []struct {
	name string
	wait bool
}{{"plain", false}, {"wait", true}}

// app is the program under test: an HTTP server whose handler's effect is
// a row in PostgreSQL (table effects, no unique constraint on the key),
// guarded by idemhttp on redisstore over go-redis' failover client.
type app struct {
	db     *sql.DB
	url    string
	client *http.Client
	// afterEffect, if set, runs in the handler after the effect's row is
	// committed and before the completion is stored.
	afterEffect func(key string)
	// completeRetries counts completions the store refused or could not
	// take (and the handler tried again); notStored counts responses sent
	// whose completion was never stored.
	completeRetries, notStored atomic.Int64
	// leaseLost counts effects whose completion the execution refused
	// because its lease was lost (it ended, or could not be renewed, while
	// the store took no writes); insertFailed counts effect inserts that
	// failed, which may have committed all the same (the request's context
	// ended as the commit's reply came). Either lets a retry run the effect
	// again: the effect is in PostgreSQL, outside the record's store.
	leaseLost, insertFailed atomic.Int64
}

// newApp starts the program on d's Sentinels. With wait, the store waits
// for every replica after each record write (redisstore.Config.WaitReplicas).
func newApp(t *testing.T, d *deployment, wait bool, lease time.Duration) *app {
	t.Helper()
	db, _ := testdb.Postgres(t)
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            masterName,
		SentinelAddrs:         d.addrs(),
		PoolSize:              64,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = rc.Close() })
	cfg := &redisstore.Config{Prefix: "idemfail"}
	if wait {
		// Every replica: with one of two, the Sentinels may promote the
		// replica that did not acknowledge a write (they elect by the
		// offsets they last polled), and a completion is lost all the
		// same (10 doubled effects in one run of seven, with 1 of 2).
		cfg.WaitReplicas, cfg.WaitTimeout = len(d.servers)-1, time.Second
	}
	store, err := redisstore.New(rc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{db: db}
	mw, err := idemhttp.New(&idemhttp.Config{
		Store: store,
		Lease: lease,
		Scope: func(*http.Request) (string, error) { return "sentinelfail", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(a.effect)))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	a.client = &http.Client{Timeout: 2 * failoverTimeout}
	return a
}

// effect inserts the key's row, then completes the request itself,
// trying again while the store cannot take the completion (a failover
// in progress, a replica that has not acknowledged it): the effect is
// outside Redis, so a response sent before its completion is stored is
// one a retry may not replay.
func (a *app) effect(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.Header.Get("Idempotency-Key")
	var id int64
	if err := a.db.QueryRowContext(ctx, `INSERT INTO effects (key) VALUES ($1) RETURNING id`, key).Scan(&id); err != nil {
		a.insertFailed.Add(1)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if a.afterEffect != nil {
		a.afterEffect(key)
	}
	resp := idem.Response{
		StatusCode: http.StatusCreated,
		Header:     http.Header{"Content-Type": {"text/plain"}},
		Body:       fmt.Appendf(nil, "%s#%d", key, id),
	}
	exec := idemhttp.ExecutionFrom(ctx)
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(failoverTimeout)
	for {
		err := exec.Complete(ctx, resp)
		if errors.Is(err, idem.ErrLeaseLost) {
			a.leaseLost.Add(1)
		}
		if err == nil || errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrFinished) {
			break // on a lost lease the middleware answers what a retry would get
		}
		if time.Now().After(deadline) {
			a.notStored.Add(1)
			break
		}
		a.completeRetries.Add(1)
		time.Sleep(50 * time.Millisecond)
	}
	idemhttp.WriteResponse(w, resp)
}

// answer is what a client got for one request.
type answer struct {
	status   int
	replayed bool
	body     string
	err      error
}

func (a answer) ok() bool { return a.err == nil && a.status/100 == 2 }

// post sends key's request once.
func (a *app) post(ctx context.Context, key string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url+"/effects", strings.NewReader(`{"key":"`+key+`"}`))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := a.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get(idemhttp.HeaderReplayed) == "true", body: string(body), err: err}
}

// until sends key's request until it gets a 2xx, or marks t failed after
// failoverTimeout; it returns every answer, the 2xx (if any) last.
func (a *app) until(t *testing.T, key string) []answer {
	t.Helper()
	var got []answer
	deadline := time.Now().Add(failoverTimeout)
	for {
		ans := a.post(t.Context(), key)
		got = append(got, ans)
		if ans.ok() {
			return got
		}
		if time.Now().After(deadline) {
			// Errorf, not Fatalf: until runs in the load's goroutines.
			t.Errorf("key %s: no 2xx within %v; last %d %q %v", key, failoverTimeout, ans.status, ans.body, ans.err)
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rows returns how many effect rows each key has.
func (a *app) rows(t *testing.T) map[string]int {
	t.Helper()
	rs, err := a.db.QueryContext(t.Context(), `SELECT key, count(*) FROM effects GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	n := map[string]int{}
	for rs.Next() {
		var k string
		var c int
		if err := rs.Scan(&k, &c); err != nil {
			t.Fatal(err)
		}
		n[k] = c
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
