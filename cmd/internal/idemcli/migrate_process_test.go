package idemcli

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
)

// migrateChildVar holds the -db value a child process of
// TestMigrateProcesses migrates; migrateChildStartVar the unix
// nanoseconds at which the children start together.
const (
	migrateChildVar      = "IDEMCLI_TEST_MIGRATE_DB"
	migrateChildStartVar = "IDEMCLI_TEST_MIGRATE_START"
)

// TestMigrateChild is the child of TestMigrateProcesses: it runs idem
// migrate once and prints its exit status and output.
func TestMigrateChild(t *testing.T) {
	raw := os.Getenv(migrateChildVar)
	if raw == "" {
		t.Skip("run by TestMigrateProcesses")
	}
	var start int64
	fmt.Sscan(os.Getenv(migrateChildStartVar), &start)
	time.Sleep(time.Until(time.Unix(0, start)))
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), []string{"migrate", "-db", raw}, strings.NewReader(""), &stdout, &stderr)
	fmt.Printf("MIGRATE-EXIT %d\n%s%s\n", code, stdout.String(), stderr.String())
}

// 6 processes run idem migrate on one fresh database at once: every one
// exits 0, one applies the migrations, each table exists once and each
// migration is recorded once.
func TestMigrateProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Parallel()
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) (raw string, db *sql.DB, count string)
	}{
		{"SQLite", func(t *testing.T) (string, *sql.DB, string) {
			return "sqlite:" + filepath.Join(t.TempDir(), "idem.db"), nil,
				"SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
		}},
		{"PostgreSQL", func(t *testing.T) (string, *sql.DB, string) {
			db, url := testdb.Postgres(t)
			return url, db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = $1"
		}},
		{"MariaDB", func(t *testing.T) (string, *sql.DB, string) {
			db, dsn := testdb.MySQL(t)
			return "mysql:" + dsn, db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw, db, count := c.setup(t)
			const n = 6
			start := time.Now().Add(2 * time.Second).UnixNano()
			outs := make([]string, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					cmd := exec.Command(os.Args[0], "-test.run=^TestMigrateChild$", "-test.count=1", "-test.v")
					cmd.Env = append(os.Environ(), migrateChildVar+"="+raw, fmt.Sprintf("%s=%d", migrateChildStartVar, start))
					out, err := cmd.CombinedOutput()
					outs[i], errs[i] = string(out), err
				})
			}
			wg.Wait()
			applied := 0
			for i := range n {
				if errs[i] != nil || !strings.Contains(outs[i], "MIGRATE-EXIT 0\n") {
					t.Errorf("migrate process %d: %v:\n%s", i, errs[i], outs[i])
				}
				if strings.Contains(outs[i], ": applied ") {
					applied++
				}
			}
			if applied != 1 {
				t.Errorf("%d of %d processes applied migrations, want 1", applied, n)
			}
			if db == nil {
				st, err := storeFlags{name: "db", raw: raw}.open(context.Background(), openOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				db = st.db
			}
			ctx := context.Background()
			for _, table := range idemTables {
				var k int
				if err := db.QueryRowContext(ctx, count, table).Scan(&k); err != nil || k != 1 {
					t.Errorf("table %s: %d instances, %v; want 1", table, k, err)
				}
			}
			var versions, distinct int
			if err := db.QueryRowContext(ctx, "SELECT count(*), count(DISTINCT version) FROM idem_schema_migrations").Scan(&versions, &distinct); err != nil {
				t.Fatal(err)
			}
			if versions == 0 || versions != distinct {
				t.Errorf("idem_schema_migrations: %d rows, %d versions; want each version once", versions, distinct)
			}
		})
	}
}
