package sqlstore_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/token"
	"github.com/idemkit/idem/token/tokentest"
)

// tokenSetup returns a database of the test's own (a new SQLite file, a
// PostgreSQL schema, a MySQL database) and a migrated TokenStore on it.
func tokenSetup(t *testing.T, srv server) (*sql.DB, *sqlstore.TokenStore) {
	t.Helper()
	db, _, s := tokenSetupAddr(t, srv)
	return db, s
}

// tokenSetupAddr is tokenSetup, and also returns the database's address:
// the SQLite file, the PostgreSQL URL or the MySQL DSN.
func tokenSetupAddr(t *testing.T, srv server) (*sql.DB, string, *sqlstore.TokenStore) {
	t.Helper()
	var (
		db   *sql.DB
		addr string
	)
	switch srv.dialect {
	case sqlstore.SQLite:
		addr = filepath.Join(t.TempDir(), "tokens.db")
		db = openDB(t, addr)
	case sqlstore.PostgreSQL:
		db, addr = testdb.Postgres(t)
	case sqlstore.MySQL:
		db, addr = testdb.MySQL(t)
	}
	return db, addr, newTokenStore(t, db, srv.dialect)
}

func newTokenStore(t testing.TB, db *sql.DB, d sqlstore.Dialect) *sqlstore.TokenStore {
	t.Helper()
	s, err := sqlstore.NewTokenStore(db, &sqlstore.Config{Dialect: d})
	if err != nil {
		t.Fatalf("NewTokenStore: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestTokenConformance(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := tokenSetup(t, srv)
		tokentest.Run(t, func(*testing.T) token.Store { return s }, tokentest.Caps{
			BeginTx:   func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			Precision: time.Millisecond,
		})
	})
}

// tokenRow is a row of idem_tokens; found is false if there is none.
type tokenRow struct {
	scope            string
	createdAt, expAt int64
	usedAt           sql.NullInt64
	result           []byte
	found            bool
}

// readToken reads the row of the token id, and checks that nothing in the
// table holds the ID itself.
func readToken(t *testing.T, srv server, db *sql.DB, id string) tokenRow {
	t.Helper()
	d, err := token.Digest(id)
	if err != nil {
		t.Fatal(err)
	}
	var r tokenRow
	err = db.QueryRowContext(t.Context(), srv.rebind(`SELECT scope, created_at, expires_at, used_at, result FROM idem_tokens WHERE digest = ?`), d).
		Scan(&r.scope, &r.createdAt, &r.expAt, &r.usedAt, &r.result)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return r
	case err != nil:
		t.Fatal(err)
	}
	r.found = true
	var raw int
	if err := db.QueryRowContext(t.Context(), srv.rebind(`SELECT count(*) FROM idem_tokens WHERE digest = ?`), id).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if raw != 0 {
		t.Fatalf("idem_tokens holds the raw ID %q", id)
	}
	return r
}

// TestTokenRace: 100 goroutines consume one token through Tokens: exactly
// one spends it, the 99 others are told it is used, with the winner's
// result, and the row holds the winner's result.
func TestTokenRace(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := tokenSetup(t, srv)
		toks, err := token.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			tok, err := toks.Issue(t.Context(), "user-1")
			if err != nil {
				t.Fatal(err)
			}
			row := readToken(t, srv, db, tok.ID)
			if !row.found || row.usedAt.Valid || row.scope != "user-1" || row.expAt-row.createdAt != token.DefaultTTL.Milliseconds() {
				t.Fatalf("row after Issue = %+v", row)
			}
			const n = 100
			errs := make([]error, n)
			race(n, func(i int) {
				errs[i] = toks.Consume(t.Context(), "user-1", tok.ID, token.Use{Result: fmt.Appendf(nil, "order-%d", i)})
			})
			winner, used := -1, 0
			for i, err := range errs {
				var ue *token.UsedError
				switch {
				case err == nil:
					if winner >= 0 {
						t.Fatalf("round %d: goroutines %d and %d both spent the token", round, winner, i)
					}
					winner = i
				case errors.As(err, &ue):
					used++
				default:
					t.Fatalf("round %d: goroutine %d: %v", round, i, err)
				}
			}
			if winner < 0 || used != n-1 {
				t.Fatalf("round %d: winner %d, %d told used; want one winner and %d used", round, winner, used, n-1)
			}
			want := fmt.Sprintf("order-%d", winner)
			for i, err := range errs {
				var ue *token.UsedError
				if errors.As(err, &ue) && string(ue.Result) != want {
					t.Fatalf("round %d: goroutine %d told result %q, want the winner's %q", round, i, ue.Result, want)
				}
			}
			row = readToken(t, srv, db, tok.ID)
			if !row.usedAt.Valid || string(row.result) != want || row.usedAt.Int64 < row.createdAt || row.usedAt.Int64 >= row.expAt {
				t.Fatalf("round %d: row = %+v, want used, with %q", round, row, want)
			}
		}
	})
}

// TestTokenConsumeTx: a shop writes the order and spends the token in one
// transaction, through Tokens.ConsumeTx: both commit, or neither does. The
// transaction may come from another pool on the same database.
func TestTokenConsumeTx(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, addr, s := tokenSetupAddr(t, srv)
		ctx := t.Context()
		srv.table(t, db, "idem_test_token_orders")
		toks, err := token.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		pools := map[string]*sql.DB{"store's pool": db}
		if srv.dialect != sqlstore.SQLite { // SQLite: one connection per file and process
			pools["another pool"] = srv.open(t, addr)
		}
		orders := func(id string) int {
			var n int
			if err := db.QueryRowContext(ctx, srv.rebind(`SELECT count(*) FROM idem_test_token_orders WHERE id = ?`), id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		for name, pool := range pools {
			for _, commit := range []bool{false, true} {
				tok, err := toks.Issue(ctx, "user-1")
				if err != nil {
					t.Fatal(err)
				}
				order := "order-" + tok.ID
				tx, err := pool.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, srv.rebind(`INSERT INTO idem_test_token_orders (id, amount) VALUES (?, 1)`), order); err != nil {
					t.Fatal(err)
				}
				if err := toks.ConsumeTx(ctx, tx, "user-1", tok.ID, token.Use{Result: []byte(order)}); err != nil {
					t.Fatalf("%s: ConsumeTx: %v", name, err)
				}
				if commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
				row := readToken(t, srv, db, tok.ID)
				if commit {
					if orders(order) != 1 || !row.usedAt.Valid || string(row.result) != order {
						t.Fatalf("%s, committed: %d orders, token row %+v; want the order and the token spent with it", name, orders(order), row)
					}
					var ue *token.UsedError
					if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{}); !errors.As(err, &ue) || string(ue.Result) != order {
						t.Fatalf("%s: Consume after the commit = %v, want used with %q", name, err, order)
					}
					continue
				}
				if orders(order) != 0 || row.usedAt.Valid || row.result != nil {
					t.Fatalf("%s, rolled back: %d orders, token row %+v; want neither", name, orders(order), row)
				}
				if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: []byte("retry")}); err != nil {
					t.Fatalf("%s: Consume after the rollback = %v, want nil", name, err)
				}
			}
		}
	})
}

// TestTokenSweepRows: Sweep deletes the rows of expired tokens, used or
// not, and only those.
func TestTokenSweepRows(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		db, s := tokenSetup(t, srv)
		ctx := t.Context()
		var short []string
		for i := range 3 {
			d := fmt.Sprintf("%064x", i+1)
			if _, err := s.Insert(ctx, "u", d, 100*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			short = append(short, d)
		}
		if err := s.Consume(ctx, "u", short[0], token.Spend{Result: []byte("r")}); err != nil {
			t.Fatal(err)
		}
		live := fmt.Sprintf("%064x", 99)
		if _, err := s.Insert(ctx, "u", live, time.Hour); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		n, err := s.Sweep(ctx, 0)
		if err != nil || n != 3 {
			t.Fatalf("Sweep = %d, %v; want 3", n, err)
		}
		var left []string
		rows, err := db.QueryContext(ctx, `SELECT digest FROM idem_tokens`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var d string
			if err := rows.Scan(&d); err != nil {
				t.Fatal(err)
			}
			left = append(left, d)
		}
		if len(left) != 1 || left[0] != live {
			t.Fatalf("rows after Sweep = %v, want only %s", left, live)
		}
	})
}

// TestTokenNotMigrated: a TokenStore on a database without idem_tokens
// says that Migrate has not run.
func TestTokenNotMigrated(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "empty.db"))
	s, err := sqlstore.NewTokenStore(db, &sqlstore.Config{Dialect: sqlstore.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Insert(t.Context(), "u", fmt.Sprintf("%064x", 1), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Insert before Migrate = %v, want an error that names Migrate", err)
	}
	if _, err := sqlstore.NewTokenStore(nil, &sqlstore.Config{Dialect: sqlstore.SQLite}); err == nil {
		t.Error("NewTokenStore(nil db) succeeded")
	}
	if _, err := sqlstore.NewTokenStore(db, nil); err == nil {
		t.Error("NewTokenStore(nil cfg) succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Consume(t.Context(), "u", fmt.Sprintf("%064x", 1), token.Spend{}); !errors.Is(err, sqlstore.ErrClosed) {
		t.Fatalf("Consume after Close = %v, want ErrClosed", err)
	}
}

// Environment of a TestTokenMultiProcess child.
const (
	envTokenChild      = "SQLSTORE_TEST_TOKEN_CHILD" // the dialect
	envTokenChildAddr  = "SQLSTORE_TEST_TOKEN_ADDR"  // the database: SQLite file, URL or DSN
	envTokenChildIDs   = "SQLSTORE_TEST_TOKEN_IDS"   // comma-separated token IDs
	envTokenChildStart = "SQLSTORE_TEST_TOKEN_START"
)

const (
	tokProcesses  = 4
	tokGoroutines = 8
	tokTokens     = 30
)

// TestTokenMultiProcess re-executes the test binary: 4 processes of 8
// goroutines each consume the same 30 tokens of one database, each with a
// result naming itself. Every token is spent exactly once across the
// processes, every other attempt is told it is used with the winner's
// result, and every row holds its winner's result.
func TestTokenMultiProcess(t *testing.T) {
	if d := os.Getenv(envTokenChild); d != "" {
		tokenChild(t, d)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	forDialects(t, func(t *testing.T, srv server) {
		db, addr, s := tokenSetupAddr(t, srv)
		// Every token stays live for the children: no cap on the scope.
		toks, err := token.New(s, &token.Config{MaxLive: -1})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for range tokTokens {
			tok, err := toks.Issue(t.Context(), "shared-user")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, tok.ID)
		}
		if srv.dialect == sqlstore.SQLite {
			_ = s.Close()
			_ = db.Close() // the file's one connection of this process goes
		}
		start := time.Now().Add(time.Second)
		type child struct {
			cmd            *exec.Cmd
			stdout, stderr bytes.Buffer
		}
		var children []*child
		for range tokProcesses {
			c := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestTokenMultiProcess$", "-test.count=1")}
			c.cmd.Env = append(os.Environ(), envTokenChild+"="+srv.dialect.String(), envTokenChildAddr+"="+addr,
				envTokenChildIDs+"="+strings.Join(ids, ","), envTokenChildStart+"="+strconv.FormatInt(start.UnixMilli(), 10))
			c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
			if err := c.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			children = append(children, c)
		}
		winners := map[string][]string{} // ID → results of the calls told nil
		told := map[string]map[string]int{}
		lines := 0
		for i, c := range children {
			if err := c.cmd.Wait(); err != nil {
				t.Fatalf("child %d: %v\nstdout:\n%s\nstderr:\n%s", i, err, c.stdout.String(), c.stderr.String())
			}
			sc := bufio.NewScanner(&c.stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) != 4 || f[0] != "TOKEN" {
					continue
				}
				lines++
				switch f[1] {
				case "spent":
					winners[f[2]] = append(winners[f[2]], f[3])
				case "used":
					if told[f[2]] == nil {
						told[f[2]] = map[string]int{}
					}
					told[f[2]][f[3]]++
				default:
					t.Fatalf("child %d: %s", i, sc.Text())
				}
			}
		}
		if want := tokProcesses * tokGoroutines * tokTokens; lines != want {
			t.Fatalf("children reported %d outcomes, want %d", lines, want)
		}
		if srv.dialect == sqlstore.SQLite {
			db = openDB(t, addr)
		}
		for _, id := range ids {
			if len(winners[id]) != 1 {
				t.Fatalf("token %s spent %d times: %v", id, len(winners[id]), winners[id])
			}
			w := winners[id][0]
			if len(told[id]) != 1 || told[id][w] != tokProcesses*tokGoroutines-1 {
				t.Fatalf("token %s: the losers were told %v, want %d times the winner's %q", id, told[id], tokProcesses*tokGoroutines-1, w)
			}
			if row := readToken(t, srv, db, id); !row.usedAt.Valid || string(row.result) != w {
				t.Fatalf("token %s: row %+v, want used with %q", id, row, w)
			}
		}
	})
}

func tokenChild(t *testing.T, dialect string) {
	ctx := context.Background()
	startMS, err := strconv.ParseInt(os.Getenv(envTokenChildStart), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	addr := os.Getenv(envTokenChildAddr)
	var s *sqlstore.TokenStore
	switch dialect {
	case sqlstore.SQLite.String():
		s = newTokenStore(t, openDB(t, addr), sqlstore.SQLite)
	case sqlstore.PostgreSQL.String():
		s = newTokenStore(t, testdb.Open(t, "pgx", addr, testenv.Postgres), sqlstore.PostgreSQL)
	case sqlstore.MySQL.String():
		s = newTokenStore(t, testdb.Open(t, "mysql", addr, testenv.MySQL), sqlstore.MySQL)
	default:
		t.Fatalf("unknown dialect %q", dialect)
	}
	toks, err := token.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Split(os.Getenv(envTokenChildIDs), ",")
	time.Sleep(time.Until(time.UnixMilli(startMS)))
	pid := os.Getpid()
	var (
		mu    sync.Mutex
		lines []string
		errs  []error
	)
	race(tokGoroutines, func(g int) {
		for i := range ids {
			id := ids[(i+g)%len(ids)]
			mine := fmt.Sprintf("p%d-g%d", pid, g)
			err := toks.Consume(ctx, "shared-user", id, token.Use{Result: []byte(mine)})
			var ue *token.UsedError
			mu.Lock()
			switch {
			case err == nil:
				lines = append(lines, fmt.Sprintf("TOKEN spent %s %s", id, mine))
			case errors.As(err, &ue):
				lines = append(lines, fmt.Sprintf("TOKEN used %s %s", id, ue.Result))
			default:
				errs = append(errs, err)
			}
			mu.Unlock()
		}
	})
	for _, l := range lines {
		fmt.Println(l)
	}
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
}
