package shop_test

import (
	"context"
	"encoding/base64"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/testenv"
)

// TestShopdTwoProcessesOneDatabase starts two shopd processes at once on
// one fresh database (so their migrations race too) and sends 100
// concurrent POST /orders with one key, alternating between them: exactly
// one order row exists for the key, every answer is its 201 (first or
// replayed) or 409 PROCESSING. With -redis both run the tiered store.
func TestShopdTwoProcessesOneDatabase(t *testing.T) {
	for _, c := range []struct {
		name  string
		b     backend
		redis bool
	}{
		// SQLite claims several processes on one host (one file).
		{"sqlite", sqliteBackend, false},
		{"sqlite+redis", sqliteBackend, true},
		{"postgres", postgresBackend, false},
		{"postgres+redis", postgresBackend, true},
		{"mysql", mysqlBackend, false},
		{"mysql+redis", mysqlBackend, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, dbArg := c.b.fresh(t)
			args := []string{"-db", dbArg}
			var rdb *redis.Client
			if c.redis {
				addr := testenv.Redis.Need(t)
				if !strings.Contains(addr, "://") {
					addr = "redis://" + addr + "/0"
				}
				opts, err := redis.ParseURL(addr)
				if err != nil {
					t.Fatalf("%s: %v", testenv.Redis.Var, err)
				}
				rdb = redis.NewClient(opts)
				t.Cleanup(func() { rdb.Close() })
				if err := rdb.Ping(t.Context()).Err(); err != nil {
					testenv.Unavailable(t, testenv.Redis.Name, testenv.Redis.Var, err)
				}
				args = append(args, "-redis", addr)
			}
			procs := []*shopd{spawnShopd(t, args...), spawnShopd(t, args...)}
			for _, p := range procs {
				p.ready()
			}

			// A user of the test's own: the database is fresh, and Redis is
			// shared between runs.
			user := strconv.FormatInt(rand.Int64N(1<<50)+1, 10)
			const key, n = "two-procs", 100
			body := `{"sku":"BOOK-1","quantity":2}`
			replies := make([]reply, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					replies[i] = do(t, "POST", procs[i%2].base+"/orders", user, key, body)
				})
			}
			close(start)
			wg.Wait()

			var created, firsts, processing int
			orderNo := ""
			for _, r := range replies {
				switch r.status {
				case http.StatusCreated:
					created++
					if r.header.Get("Idempotent-Replayed") != "true" {
						firsts++
					}
					no, _ := r.json(t)["order_no"].(string)
					if orderNo == "" {
						orderNo = no
					} else if no != orderNo {
						t.Errorf("two different orders answered: %s and %s", orderNo, no)
					}
				case http.StatusConflict:
					processing++
					if code := r.json(t)["code"]; code != "PROCESSING" {
						t.Errorf("409 with code %v, want PROCESSING", code)
					}
				default:
					t.Errorf("unexpected answer %d %s (%v)", r.status, r.body, r.err)
				}
			}
			t.Logf("%d×201 (%d first, %d replayed), %d×409 PROCESSING", created, firsts, created-firsts, processing)
			if firsts != 1 {
				t.Errorf("%d answers came from an execution of the handler, want exactly 1", firsts)
			}
			var rows int
			if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM shop_orders WHERE user_id = "+user).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != 1 {
				t.Fatalf("%d order rows for one key, want 1", rows)
			}

			// Once the first has finished, both processes replay it.
			// (With Redis in front, an in-flight marker whose deletion timed
			// out on a loaded machine answers 409 for up to its TTL, 1 s: a
			// client retries after Retry-After.)
			for _, p := range procs {
				r := do(t, "POST", p.base+"/orders", user, key, body)
				for deadline := time.Now().Add(5 * time.Second); r.status == http.StatusConflict && time.Now().Before(deadline); {
					time.Sleep(200 * time.Millisecond)
					r = do(t, "POST", p.base+"/orders", user, key, body)
				}
				if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.json(t)["order_no"] != orderNo {
					t.Fatalf("retry on %s: %d %v %s", p.base, r.status, r.header, r.body)
				}
			}
			if rdb != nil {
				// The tiered store caches the completed record in Redis. A
				// Redis call slower than tieredstore's 50 ms timeout (a
				// loaded machine) skips Redis for a second, so replay until
				// the entry appears.
				b64 := base64.RawURLEncoding.EncodeToString
				entry := "idem-cache:{" + b64([]byte("user:"+user)) + "." + b64([]byte(key)) + "}"
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
					got, err := rdb.Exists(context.Background(), entry).Result()
					if err == nil && got == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("no Redis entry %s after 10 s of replays (%d, %v): is -redis in use?", entry, got, err)
					}
					if r := do(t, "POST", procs[0].base+"/orders", user, key, body); r.status != http.StatusCreated {
						t.Fatalf("replay: %d %s", r.status, r.body)
					}
				}
			}
			for _, p := range procs {
				p.stop()
			}
		})
	}
}
