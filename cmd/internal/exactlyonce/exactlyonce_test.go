package exactlyonce

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/redisstore"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/tieredstore"
)

const (
	processes  = 4
	goroutines = 50
	keys       = 200
	perWorker  = 40 // keys each goroutine sends, drawn from the 200
	childVar   = "IDEM_EXACTLYONCE_CHILD"
	// poolSize bounds each process's connections to each database, as a
	// production pool would: 4 × 50 goroutines would otherwise exceed the
	// servers' connection limits, and the other test packages that run
	// at the same time need their share of PostgreSQL's 100.
	poolSize = 8
)

// outcome is what one request's client saw.
type outcome struct {
	Key      string `json:"key"`
	Status   int    `json:"status"`
	Replayed bool   `json:"replayed"`
	Body     string `json:"body"`
	Code     string `json:"code,omitempty"`
}

func TestMain(m *testing.M) {
	if raw := os.Getenv(killVar); raw != "" {
		err := killedChild(raw)
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	if raw := os.Getenv(childVar); raw != "" {
		if err := child(raw); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type childArgs struct {
	Store    string `json:"store"` // postgres, mysql, redis, tiered
	Run      string `json:"run"`   // the run's id: effect rows and record scopes
	Postgres string `json:"postgres"`
	MySQL    string `json:"mysql"`
	Redis    string `json:"redis"`
}

// openStore builds the store a process uses, and whether the handler may
// complete in its PostgreSQL transaction.
func openStore(ctx context.Context, a childArgs, effects *sql.DB) (idem.Store, bool, func(), error) {
	switch a.Store {
	case "postgres":
		s, err := sqlstore.New(effects, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
		if err != nil {
			return nil, false, nil, err
		}
		return s, true, func() {}, s.Migrate(ctx)
	case "mysql":
		db, err := sql.Open("mysql", a.MySQL)
		if err != nil {
			return nil, false, nil, err
		}
		db.SetMaxOpenConns(poolSize)
		s, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.MySQL})
		if err != nil {
			return nil, false, nil, err
		}
		return s, false, func() { db.Close() }, s.Migrate(ctx)
	case "redis":
		c := redis.NewClient(&redis.Options{Addr: a.Redis})
		s, err := redisstore.New(c, &redisstore.Config{Prefix: "idem-eo-" + a.Run})
		return s, false, func() { c.Close() }, err
	case "tiered":
		truth, err := sqlstore.New(effects, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
		if err != nil {
			return nil, false, nil, err
		}
		if err := truth.Migrate(ctx); err != nil {
			return nil, false, nil, err
		}
		c := redis.NewClient(&redis.Options{Addr: a.Redis})
		s, err := tieredstore.New(c, truth, &tieredstore.Config{Prefix: "idem-eo-cache-" + a.Run})
		return s, true, func() { c.Close() }, err
	}
	return nil, false, nil, fmt.Errorf("unknown store %q", a.Store)
}

// child is one process: 50 goroutines send keys through the middleware and
// print what each client saw, one JSON line per request.
func child(raw string) error {
	var a childArgs
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		return err
	}
	ctx := context.Background()
	effects, err := sql.Open("pgx", a.Postgres)
	if err != nil {
		return err
	}
	defer effects.Close()
	effects.SetMaxOpenConns(poolSize)
	store, inTx, closeStore, err := openStore(ctx, a, effects)
	if err != nil {
		return err
	}
	defer closeStore()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, Logger: log, Scope: func(*http.Request) (string, error) { return "run-" + a.Run, nil }})
	if err != nil {
		return err
	}
	pid := os.Getpid()
	effect := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get("Idempotency-Key")
		time.Sleep(time.Duration(rand.N(3)) * time.Millisecond) // widen the window
		tx, err := effects.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO idem_eo_effects (run, key, pid) VALUES ($1, $2, $3)`, a.Run, key, pid); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		resp := idem.Response{StatusCode: http.StatusCreated, Body: fmt.Appendf(nil, "%s by %d", key, pid)}
		if inTx {
			if err := idemhttp.ExecutionFrom(ctx).CompleteTx(ctx, tx, resp); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		idemhttp.WriteResponse(w, resp)
	}
	h := mw.Handler(http.HandlerFunc(effect))

	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for _, k := range rand.Perm(keys)[:perWorker] {
				key := fmt.Sprintf("key-%03d", k)
				r := httptest.NewRequest(http.MethodPost, "/effects", strings.NewReader(`{"n":1}`))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				o := outcome{Key: key, Status: w.Code, Replayed: w.Header().Get("Idempotent-Replayed") == "true", Body: w.Body.String()}
				if w.Code != http.StatusCreated {
					var p struct{ Code string }
					json.Unmarshal(w.Body.Bytes(), &p)
					o.Code, o.Body = p.Code, ""
				}
				line, _ := json.Marshal(o)
				mu.Lock()
				out.Write(append(line, '\n'))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return nil
}

func TestExactlyOnceAcrossProcesses(t *testing.T) {
	pg := testenv.Postgres.Need(t)
	ctx := context.Background()
	effects, err := sql.Open("pgx", pg)
	if err != nil {
		t.Fatal(err)
	}
	defer effects.Close()
	if _, err := effects.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idem_eo_effects (
		id bigserial PRIMARY KEY, run text NOT NULL, key text NOT NULL, pid int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	stores := []struct {
		name string
		need func(*testing.T) childArgs
	}{
		{"sqlstore-postgres", func(t *testing.T) childArgs { return childArgs{Store: "postgres"} }},
		{"sqlstore-mysql", func(t *testing.T) childArgs { return childArgs{Store: "mysql", MySQL: testenv.MySQL.Need(t)} }},
		{"redisstore", func(t *testing.T) childArgs { return childArgs{Store: "redis", Redis: testenv.Redis.Need(t)} }},
		{"tieredstore", func(t *testing.T) childArgs { return childArgs{Store: "tiered", Redis: testenv.Redis.Need(t)} }},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			a := st.need(t)
			a.Postgres = pg
			a.Run = fmt.Sprintf("%s-%d-%d", st.name, time.Now().UnixNano(), rand.N(1000000))
			raw, _ := json.Marshal(a)

			outs := make([][]byte, processes)
			var wg sync.WaitGroup
			for i := range processes {
				wg.Go(func() {
					cmd := exec.Command(os.Args[0], "-test.run=^$")
					cmd.Env = append(os.Environ(), childVar+"="+string(raw))
					var stderr strings.Builder
					cmd.Stderr = &stderr
					out, err := cmd.Output()
					if err != nil || stderr.Len() > 0 {
						t.Errorf("process %d: %v\n%s", i, err, firstLines(stderr.String(), 10))
					}
					outs[i] = out
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}

			// The effect: exactly one row per key.
			rows, err := effects.QueryContext(ctx, `SELECT key, count(*) FROM idem_eo_effects WHERE run = $1 GROUP BY key`, a.Run)
			if err != nil {
				t.Fatal(err)
			}
			effectsPerKey := map[string]int{}
			for rows.Next() {
				var k string
				var n int
				if err := rows.Scan(&k, &n); err != nil {
					t.Fatal(err)
				}
				effectsPerKey[k] = n
			}
			rows.Close()
			if len(effectsPerKey) != keys {
				t.Errorf("%d keys have an effect, want all %d", len(effectsPerKey), keys)
			}
			for k, n := range effectsPerKey {
				if n != 1 {
					t.Errorf("key %s: %d effects, want 1", k, n)
				}
			}

			// What the clients saw: per key one first execution, and every
			// other 201 is a replay of the same body; the rest are 409.
			firsts := map[string]string{}
			bodies := map[string]map[string]bool{}
			var requests, replays, processing int
			for i, out := range outs {
				for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
					var o outcome
					if err := json.Unmarshal([]byte(line), &o); err != nil {
						t.Fatalf("process %d printed %q: %v", i, line, err)
					}
					requests++
					switch {
					case o.Status == http.StatusCreated && !o.Replayed:
						if prev, ok := firsts[o.Key]; ok {
							t.Errorf("key %s executed twice: %q and %q", o.Key, prev, o.Body)
						}
						firsts[o.Key] = o.Body
					case o.Status == http.StatusCreated:
						replays++
					case o.Status == http.StatusConflict && o.Code == "PROCESSING":
						processing++
					default:
						t.Errorf("key %s: unexpected answer %d %s", o.Key, o.Status, o.Code)
					}
					if o.Status == http.StatusCreated {
						if bodies[o.Key] == nil {
							bodies[o.Key] = map[string]bool{}
						}
						bodies[o.Key][o.Body] = true
					}
				}
			}
			for k, bs := range bodies {
				if len(bs) != 1 {
					t.Errorf("key %s answered with %d different bodies: %v", k, len(bs), bs)
				}
			}
			if len(firsts) != len(effectsPerKey) {
				t.Errorf("%d keys executed according to the clients, %d according to the table", len(firsts), len(effectsPerKey))
			}
			if want := processes * goroutines * perWorker; requests != want {
				t.Errorf("%d answers, want %d", requests, want)
			}
			t.Logf("%d requests over %d processes: %d keys executed once each, %d replays, %d×409 PROCESSING",
				requests, processes, len(firsts), replays, processing)
		})
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
