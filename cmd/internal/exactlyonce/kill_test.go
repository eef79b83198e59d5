package exactlyonce

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
)

const (
	killVar   = "IDEM_EXACTLYONCE_KILLED"
	killLease = time.Second
)

// killRig is one instance: the middleware over sqlstore on PostgreSQL and a
// handler whose effect (a row) commits with the stored response. With
// block set, the handler stops after its insert, before CompleteTx, and
// says so on stdout: the instance is then killed there.
func killRig(db *sql.DB, run string, block bool) (http.Handler, error) {
	store, err := sqlstore.New(db, &sqlstore.Config{Dialect: sqlstore.PostgreSQL})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(context.Background()); err != nil {
		return nil, err
	}
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, Lease: killLease, Scope: func(*http.Request) (string, error) { return run, nil }})
	if err != nil {
		return nil, err
	}
	return mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO idem_kill_effects (run, pid) VALUES ($1, $2)`, run, os.Getpid()); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if block {
			fmt.Println("in the handler, effect written, not committed")
			select {} // killed here
		}
		resp, _ := idemhttp.JSONResponse(http.StatusCreated, map[string]int{"pid": os.Getpid()})
		if err := idemhttp.ExecutionFrom(ctx).CompleteTx(ctx, tx, resp); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		idemhttp.WriteResponse(w, resp)
	})), nil
}

func postKey(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":5}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// killedChild runs in the child process: it sends one request and blocks in
// the handler until it is killed.
func killedChild(raw string) error {
	var a childArgs
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		return err
	}
	db, err := sql.Open("pgx", a.Postgres)
	if err != nil {
		return err
	}
	h, err := killRig(db, a.Run, true)
	if err != nil {
		return err
	}
	postKey(h, "pay-1")
	return fmt.Errorf("the handler returned; it should have blocked")
}

// An instance is killed (SIGKILL) in the middle of a handler, after its
// effect was written in the transaction and before it committed: the
// database rolls the effect back, the key stays in flight until the lease
// ends, and then one retry runs the effect once.
func TestKilledInstanceRetryRunsOnce(t *testing.T) {
	pg := testenv.Postgres.Need(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", pg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idem_kill_effects (
		id bigserial PRIMARY KEY, run text NOT NULL, pid int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	run := fmt.Sprintf("kill-%d", time.Now().UnixNano())
	raw, _ := json.Marshal(childArgs{Run: run, Postgres: pg})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killVar+"="+string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			line <- s.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		if !ok || !strings.HasPrefix(l, "in the handler") {
			cmd.Process.Kill()
			t.Fatalf("child said %q", l)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the child never reached its handler")
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	cmd.Wait()

	var status string
	if err := db.QueryRowContext(ctx, `SELECT status FROM idem_records WHERE scope = $1 AND idempotency_key = 'pay-1'`, run).Scan(&status); err != nil || status != "processing" {
		t.Fatalf("after the kill the record is %q (%v); want processing", status, err)
	}

	h, err := killRig(db, run, false)
	if err != nil {
		t.Fatal(err)
	}
	if w := postKey(h, "pay-1"); w.Code != http.StatusConflict {
		t.Fatalf("retry within the killed instance's lease: %d %s; want 409", w.Code, w.Body)
	}
	time.Sleep(killLease + 300*time.Millisecond)
	w := postKey(h, "pay-1")
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the lease: %d %s %v; want a first execution", w.Code, w.Body, w.Header())
	}
	if w := postKey(h, "pay-1"); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after completion: %d %v; want a replay", w.Code, w.Header())
	}
	var n, killedRows int
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE pid = $2) FROM idem_kill_effects WHERE run = $1`, run, cmd.Process.Pid).Scan(&n, &killedRows); err != nil {
		t.Fatal(err)
	}
	if n != 1 || killedRows != 0 {
		t.Fatalf("%d effect rows (%d from the killed instance); want 1, and none of the killed instance's", n, killedRows)
	}
}
