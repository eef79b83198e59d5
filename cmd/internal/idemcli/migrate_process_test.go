package idemcli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
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
	for _, c := range migrateTargets {
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
			wantMigratedOnce(t, raw, db, count)
		})
	}
}
