package idemcli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// A database migrated before the tables of steps existed (idem_ops and
// idem_steps dropped, their migration unrecorded): idem ops and idem
// retry fail with exit status 1 and the advice to migrate, on every SQL
// database; idem migrate then adds the tables.
func TestOpsOlderSchema(t *testing.T) {
	t.Parallel()
	for _, c := range migrateTargets {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			raw, _, _ := c.setup(t)
			if code, _, errOut := run(t, "", "migrate", "-db", raw); code != exitOK {
				t.Fatalf("migrate: exit %d %q", code, errOut)
			}
			st, err := storeFlags{name: "db", raw: raw}.open(context.Background(), openOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(st.Close)
			ctx := context.Background()
			for _, q := range []string{"DROP TABLE idem_steps", "DROP TABLE idem_ops",
				"DELETE FROM idem_schema_migrations WHERE name LIKE '%steps%'"} {
				if _, err := st.db.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			for _, args := range [][]string{
				{"ops", "-db", raw},
				{"ops", "-db", raw, "-key", "k"},
				{"retry", "-db", raw, "-key", "k", "-yes"},
			} {
				code, out, errOut := run(t, "", args...)
				if code != exitFail || !strings.Contains(errOut, errMissingTables.Error()) || out != "" {
					t.Errorf("idem %q on an older schema: exit %d, stdout %q, stderr %q; want exit 1 and the advice to migrate", args[:1], code, out, errOut)
				}
			}
			if code, out, errOut := run(t, "", "migrate", "-db", raw); code != exitOK || !strings.Contains(out, "idem_ops") {
				t.Fatalf("migrate of the older schema: exit %d %q %q", code, out, errOut)
			}
			if code, out, errOut := run(t, "", "ops", "-db", raw); code != exitOK || !strings.Contains(out, "Dead operations (0):") {
				t.Fatalf("ops after the migration: exit %d %q %q", code, out, errOut)
			}
		})
	}
}

// hostile holds what a terminal must never get raw: escape sequences
// (7-bit and the 8-bit CSI), a bidi override, backspace and DEL, and
// invalid UTF-8.
var hostile = []string{"\x1b[2J\x1b]0;pwned\x07", "\u009b31m", "\u202egnp.exe", "\x08\x7f", "\xff\xfe"}

// Stored values of an operation (written by another program, or an old
// bug) reach the terminal escaped: idem ops, in a list and for one
// operation, and idem retry print no control character, bidi override
// or invalid UTF-8 of theirs as it is.
func TestOpsHostileValues(t *testing.T) {
	t.Parallel()
	raw := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	if code, _, errOut := run(t, "", "migrate", "-db", raw); code != exitOK {
		t.Fatalf("migrate: exit %d %q", code, errOut)
	}
	st, err := storeFlags{name: "db", raw: raw}.open(context.Background(), openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	for i, h := range hostile {
		for _, state := range []string{"dead", "waiting"} {
			// The waiting ones have a scope that no record can have
			// (but the bidi override's): listed only.
			key, scope := fmt.Sprintf("k%d-%s", i, state), "tenant"
			if state == "waiting" {
				scope = "s" + h
			}
			if _, err := st.db.ExecContext(ctx, `INSERT INTO idem_ops (scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, 1, 0, ?, 0, 0, 0)`, scope, key, "n"+h, "fp"+h, []byte(h), state, "err"+h); err != nil {
				t.Fatal(err)
			}
			for j, result := range []string{h, "text " + h, "line\n" + h} {
				if _, err := st.db.ExecContext(ctx, `INSERT INTO idem_steps (scope, idempotency_key, step, result, created_at) VALUES (?, ?, ?, ?, 0)`,
					scope, key, fmt.Sprintf("step%d%s", j, h), []byte(result)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	clean := func(what, out string) {
		t.Helper()
		for _, r := range out {
			if r == '\n' || r == '\t' {
				continue
			}
			if r == '\uFFFD' || r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || (r >= 0x200e && r <= 0x200f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
				t.Errorf("%s prints %U raw:\n%q", what, r, out)
				return
			}
		}
	}
	for _, state := range []string{"dead", "waiting"} {
		code, out, errOut := run(t, "", "ops", "-db", raw, "-state", state)
		if code != exitOK || !strings.Contains(out, fmt.Sprintf("(%d):", len(hostile))) {
			t.Fatalf("ops -state %s: exit %d %q\n%s", state, code, errOut, out)
		}
		clean("ops -state "+state, out+errOut)
	}
	for i, h := range hostile {
		code, out, errOut := run(t, "", "ops", "-db", raw, "-scope", "tenant", "-key", fmt.Sprintf("k%d-dead", i))
		if code != exitOK || !strings.Contains(out, "checkpoints  3") {
			t.Fatalf("ops -key (hostile %d): exit %d %q\n%s", i, code, errOut, out)
		}
		clean(fmt.Sprintf("ops -key (hostile %d)", i), out+errOut)
		code, out, errOut = run(t, "", "retry", "-db", raw, "-scope", "tenant", "-key", fmt.Sprintf("k%d-dead", i), "-yes")
		if code != exitOK || !strings.Contains(out, "retried: ") {
			t.Fatalf("retry (hostile %d): exit %d %q\n%s", i, code, errOut, out)
		}
		clean(fmt.Sprintf("retry (hostile %d)", i), out+errOut)
		code, out, errOut = run(t, "", "ops", "-db", raw, "-scope", "s"+h, "-key", fmt.Sprintf("k%d-waiting", i))
		if idem.ValidateScope("s"+h) != nil && (code != exitFail || !strings.Contains(errOut, "no operation for key")) {
			t.Fatalf("ops -key under a scope no record can have (hostile %d): exit %d %q", i, code, errOut)
		}
		clean(fmt.Sprintf("ops -key of nothing (hostile %d)", i), out+errOut)
	}
}
