package idemcli

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/dsn"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/tieredstore"
)

const migrateHelp = `Usage: idem migrate -db DSN

idem migrate creates or updates every table of idem's SQL packages in the
database: idem_records (idemhttp, Guard), idem_tokens (token), idem_locks
(lock), idem_outbox (outbox), idem_inbox (inbox), idem_ops and idem_steps
(steps: operations and their checkpoints), and the schema's own
idem_schema_migrations. It is idempotent (a database that is up to date is
left as it is) and safe to run from several processes at once: one
migrates, the others then find nothing to do. It reports how many
migrations it applied.

-db is sqlite:PATH, postgres://user:pass@host:port/db or
mysql://user:pass@host:port/db (or mysql:GO-SQL-DRIVER-DSN). Redis needs
no migration.`

const sweepHelp = `Usage: idem sweep -db DSN [-every 1m] [-retention 168h]

idem sweep removes what has expired, and reports what it removed:
  - idempotency records whose retention ended (completed ones) or whose
    lease ended more than their retention ago (abandoned ones); never a
    record in flight;
  - tokens (package token) past their expiry (SQL stores; Redis expires
    them itself);
  - done operations of package steps whose retention ended (SQL stores:
    sqlstore.StepJournal's Sweep; never a running, waiting or dead one);
  - with -retention only: outbox messages sent more than -retention ago,
    and inbox records finished (succeeded or dead) more than -retention
    ago. They have no expiry of their own, and an inbox record removed
    too early lets a redelivered message run again: give a -retention
    longer than any redelivery (the broker's de-duplication window, the
    consumer's longest retry).
Once by default; with -every D, again every D until SIGINT or SIGTERM.

` + storeHelp

const inspectHelp = `Usage: idem inspect -db DSN [-scope S | -scope-header-value V] -key K [-body]
       idem inspect -db DSN [-limit N]

With -key, idem inspect prints one record: its status, fence, lease,
times and the stored answer's status, headers and size (its body only
with -body: printable text as it is, anything else in hex). Header names
and values that are not printable text are shown quoted and escaped. Without -key, it lists the records in flight and the oldest
records (at most -limit of each); listing needs a SQL store.

The scope is the record's as stored: -scope S as is, or
-scope-header-value V for a record of idem proxy -scope-header, which
stores the SHA-256 of the header's value. Neither means the empty scope
(idem proxy without -scope-header).

` + storeHelp

const evictHelp = `Usage: idem evict -db DSN [-scope S | -scope-header-value V] -key K [-yes] [-force]

idem evict deletes one record, so that the next request with its key runs
again. It prints the record and asks for confirmation on standard input
unless -yes is given; an answer other than y or yes deletes nothing (exit
status 1).

It deletes the record it printed and nothing else: if the record changed
meanwhile (a retry took it over after its lease ended, or a new request
replaced it), it deletes nothing, says so and exits with status 1; run it
again to see the record as it is now.

A record in flight (processing, its lease not ended) is refused unless
-force is given. Its execution may still be running: deleting its record
lets a retry run the request again while that execution runs, so the
effect may happen twice. Without -force, wait until the lease ends (the
execution died, or it completes).

Give -cache too when a proxy runs with Redis in front of the database, so
that Redis forgets the record as well. Scopes as for idem inspect.

` + storeHelp

func init() {
	register("migrate", &command{
		synopsis: "create every idem table in a SQL database",
		help:     migrateHelp,
		flags: func(fs *flag.FlagSet) func(*env) int {
			db := fs.String("db", "", "the SQL database: sqlite:PATH, postgres://…, mysql://… (required)")
			return func(e *env) int { return exit(e, "migrate", runMigrate(e, *db)) }
		},
	})
	register("sweep", &command{
		synopsis: "remove expired records",
		help:     sweepHelp,
		flags: func(fs *flag.FlagSet) func(*env) int {
			s := &sweepFlags{}
			fs.StringVar(&s.db, "db", "", "the store: a `DSN` (required)")
			fs.DurationVar(&s.every, "every", 0, "sweep again every `interval` until stopped; 0 sweeps once")
			fs.DurationVar(&s.retention, "retention", 0, "also remove outbox messages and inbox records finished longer ago than this; 0 leaves them")
			fs.IntVar(&s.batch, "batch", idem.DefaultSweepLimit, "rows removed per statement")
			return func(e *env) int { return exit(e, "sweep", s.run(e)) }
		},
	})
	register("inspect", &command{
		synopsis: "show one record, or the in-flight and oldest ones",
		help:     inspectHelp,
		flags: func(fs *flag.FlagSet) func(*env) int {
			r := &recordFlags{}
			r.declare(fs)
			body := fs.Bool("body", false, "print the stored answer's body too")
			limit := fs.Int("limit", 20, "without -key: how many records of each list")
			return func(e *env) int { return exit(e, "inspect", runInspect(e, r, *body, *limit)) }
		},
	})
	register("evict", &command{
		synopsis: "delete one record",
		help:     evictHelp,
		flags: func(fs *flag.FlagSet) func(*env) int {
			r := &recordFlags{}
			r.declare(fs)
			fs.StringVar(&r.cache, "cache", "", "the Redis in front of -db, if any: redis://host:port/db")
			yes := fs.Bool("yes", false, "delete without asking")
			force := fs.Bool("force", false, "delete a record in flight too (a retry may then run the request again while its execution still runs)")
			return func(e *env) int { return exit(e, "evict", runEvict(e, r, *yes, *force)) }
		},
	})
}

// exit reports err (if any) and returns the exit status.
func exit(e *env, name string, err error) int {
	if err != nil {
		return fail(e, name, err)
	}
	return exitOK
}

func noArgs(e *env) error {
	if len(e.args) > 0 {
		return usagef("unexpected argument %q: give the values as flags (see 'idem help')", e.args[0])
	}
	return nil
}

// existingDB opens the store of -db for a command that reads or removes
// (not migrate): a SQLite file must exist already.
func existingDB(ctx context.Context, f storeFlags) (*openedStore, error) {
	if f.raw == "" {
		return nil, usagef("-db is required: the store, e.g. -db sqlite:idem-proxy.db or -db postgres://user@host/db")
	}
	if t, err := dsn.ParseDB(f.raw); err == nil && t.Dialect == sqlstore.SQLite {
		if _, err := os.Stat(t.SQLitePath); err != nil {
			return nil, fmt.Errorf("-db %s: %w (check the path; idem migrate -db %s creates it)", f.raw, err, f.raw)
		}
	}
	return f.open(ctx, openOptions{})
}

// storeErr turns a SQL error about missing tables into the advice to
// migrate.
func storeErr(err error) error {
	if err != nil && (strings.Contains(err.Error(), "has Store.Migrate run?") || strings.Contains(err.Error(), "(has Migrate run?)")) {
		return fmt.Errorf("%w: %v", errMissingTables, err)
	}
	return err
}

func runMigrate(e *env, raw string) error {
	if err := noArgs(e); err != nil {
		return err
	}
	if raw == "" {
		return usagef("-db is required: the SQL database to migrate, e.g. -db postgres://user@host/db")
	}
	if dsn.IsRedis(raw) {
		return usagef("-db %s is Redis, which needs no migration: give -db a SQL database", dsn.Redact(raw))
	}
	applied := &migrationCounter{}
	st, err := storeFlags{name: "db", raw: raw}.open(e.ctx, openOptions{log: slog.New(applied)})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.sql.Migrate(e.ctx); err != nil {
		return fmt.Errorf("-db %s: %w", st.display, err)
	}
	total := appliedMigrations(e.ctx, st)
	if n := applied.n.Load(); n == 0 {
		fmt.Fprintf(e.stdout, "%s: up to date (%d migrations)\n", st.display, total)
	} else {
		fmt.Fprintf(e.stdout, "%s: applied %d migrations (%d in all): idem_records, idem_tokens, idem_locks, idem_outbox, idem_inbox, idem_ops, idem_steps\n",
			st.display, n, total)
	}
	return nil
}

// migrationCounter is a slog.Handler that counts the migrations a
// sqlstore.Store reports it applied (and drops every other record).
type migrationCounter struct{ n atomic.Int64 }

func (c *migrationCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *migrationCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *migrationCounter) WithGroup(string) slog.Handler            { return c }

func (c *migrationCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "sqlstore: migration applied" {
		c.n.Add(1)
	}
	return nil
}

// appliedMigrations counts the rows of idem_schema_migrations (0 when the
// table does not exist).
func appliedMigrations(ctx context.Context, st *openedStore) int {
	var n int
	if err := st.db.QueryRowContext(ctx, "SELECT count(*) FROM idem_schema_migrations").Scan(&n); err != nil {
		return 0
	}
	return n
}

type sweepFlags struct {
	db        string
	every     time.Duration
	retention time.Duration
	batch     int
}

func (s *sweepFlags) run(e *env) error {
	if err := noArgs(e); err != nil {
		return err
	}
	switch {
	case s.every < 0:
		return usagef("-every must not be negative (0 sweeps once)")
	case s.retention < 0:
		return usagef("-retention must not be negative (0 leaves the outbox and the inbox alone)")
	case s.batch <= 0:
		return usagef("-batch must be positive, e.g. -batch %d", idem.DefaultSweepLimit)
	}
	st, err := existingDB(e.ctx, storeFlags{name: "db", raw: s.db})
	if err != nil {
		return err
	}
	defer st.Close()
	if st.redis != nil && s.retention > 0 {
		return usagef("-retention sweeps SQL outbox and inbox tables, and -db is Redis: leave -retention out")
	}
	for {
		if err := s.once(e, st); err != nil {
			if e.ctx.Err() != nil {
				return nil
			}
			return err
		}
		if s.every == 0 {
			return nil
		}
		select {
		case <-e.ctx.Done():
			return nil
		case <-time.After(s.every):
		}
	}
}

// once sweeps everything once and reports it.
func (s *sweepFlags) once(e *env, st *openedStore) error {
	type part struct {
		what  string
		sweep func(ctx context.Context, limit int) (int, error)
	}
	parts := []part{{"records", st.store.Sweep}}
	if st.sql != nil {
		tokens, err := sqlstore.NewTokenStore(st.db, &sqlstore.Config{Dialect: st.dialect})
		if err != nil {
			return err
		}
		defer tokens.Close()
		ops, err := sqlstore.NewStepJournal(st.db, &sqlstore.Config{Dialect: st.dialect})
		if err != nil {
			return err
		}
		defer ops.Close()
		parts = append(parts, part{"tokens", tokens.Sweep}, part{"operations", ops.Sweep})
		if s.retention > 0 {
			ob, err := sqlstore.NewOutboxStore(st.db, &sqlstore.OutboxConfig{Dialect: st.dialect})
			if err != nil {
				return err
			}
			defer ob.Close()
			ib, err := sqlstore.NewInboxStore(st.db, &sqlstore.Config{Dialect: st.dialect})
			if err != nil {
				return err
			}
			defer ib.Close()
			parts = append(parts,
				part{"outbox messages", func(ctx context.Context, limit int) (int, error) { return ob.Sweep(ctx, s.retention, limit) }},
				part{"inbox records", func(ctx context.Context, limit int) (int, error) { return ib.Sweep(ctx, s.retention, limit) }})
		}
	}
	var report []string
	for _, p := range parts {
		total := 0
		for {
			n, err := p.sweep(e.ctx, s.batch)
			total += n
			if err != nil {
				return fmt.Errorf("sweep %s: %w", p.what, storeErr(err))
			}
			if n < s.batch {
				break
			}
		}
		report = append(report, fmt.Sprintf("%d %s", total, p.what))
	}
	fmt.Fprintf(e.stdout, "%s %s: removed %s\n", time.Now().UTC().Format(time.RFC3339), st.display, strings.Join(report, ", "))
	return nil
}

// recordFlags name one record (or none, for inspect's lists).
type recordFlags struct {
	db, cache, scope, scopeHeaderValue, key string
}

func (r *recordFlags) declare(fs *flag.FlagSet) {
	fs.StringVar(&r.db, "db", "", "the store: a `DSN` (required)")
	fs.StringVar(&r.scope, "scope", "", "the record's scope as stored")
	fs.StringVar(&r.scopeHeaderValue, "scope-header-value", "", "the value of idem proxy's -scope-header: the scope is its SHA-256")
	fs.StringVar(&r.key, "key", "", "the record's idempotency key")
}

// resolve returns the record's scope, from -scope or -scope-header-value.
func (r *recordFlags) resolve() (string, error) {
	if r.scopeHeaderValue != "" {
		if r.scope != "" {
			return "", usagef("give -scope or -scope-header-value, not both")
		}
		return hashScope(r.scopeHeaderValue), nil
	}
	return r.scope, nil
}

func runInspect(e *env, r *recordFlags, body bool, limit int) error {
	if err := noArgs(e); err != nil {
		return err
	}
	scope, err := r.resolve()
	if err != nil {
		return err
	}
	if r.key == "" && (scope != "" || body) {
		return usagef("-key is required with -scope, -scope-header-value or -body: the record's idempotency key")
	}
	if limit <= 0 {
		return usagef("-limit must be positive, e.g. -limit 20")
	}
	st, err := existingDB(e.ctx, storeFlags{name: "db", raw: r.db})
	if err != nil {
		return err
	}
	defer st.Close()
	if r.key != "" {
		rec, err := st.store.Get(e.ctx, scope, r.key)
		if errors.Is(err, idem.ErrNotFound) {
			return fmt.Errorf("no record for key %q in scope %q (check -scope or -scope-header-value, and -key)", r.key, scope)
		}
		if err != nil {
			return storeErr(err)
		}
		printRecord(e.stdout, rec, body)
		return nil
	}
	if st.sql == nil {
		return usagef("listing records needs a SQL store, and -db is Redis: give -key to inspect one record")
	}
	for _, l := range []struct {
		title  string
		status idem.Status
	}{{"In flight", idem.StatusProcessing}, {"Oldest", ""}} {
		recs, err := st.sql.List(e.ctx, l.status, limit)
		if err != nil {
			return storeErr(err)
		}
		fmt.Fprintf(e.stdout, "%s (%d):\n", l.title, len(recs))
		if len(recs) == 0 {
			fmt.Fprintln(e.stdout, "  none")
		}
		for _, rec := range recs {
			fmt.Fprintf(e.stdout, "  %s\n", oneLine(rec))
		}
		fmt.Fprintln(e.stdout)
	}
	return nil
}

// oneLine describes rec on one line.
func oneLine(rec idem.Record) string {
	s := fmt.Sprintf("scope=%q key=%q %s fence=%d created=%s", rec.Scope, rec.Key, rec.Status, rec.Fence, stamp(rec.CreatedAt))
	switch {
	case rec.Status == idem.StatusProcessing:
		s += " lease=" + leaseState(rec.LeaseUntil)
	case rec.Response != nil:
		s += fmt.Sprintf(" response=%d", rec.Response.StatusCode)
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func leaseState(until time.Time) string {
	d := time.Until(until).Round(time.Millisecond)
	if d > 0 {
		return stamp(until) + " (live, " + d.String() + " left)"
	}
	return stamp(until) + " (ended " + (-d).String() + " ago)"
}

// printRecord prints rec; its body only if body.
func printRecord(w io.Writer, rec idem.Record, body bool) {
	fmt.Fprintf(w, "scope        %q\n", rec.Scope)
	fmt.Fprintf(w, "key          %q\n", rec.Key)
	fmt.Fprintf(w, "status       %s\n", rec.Status)
	fmt.Fprintf(w, "fence        %d\n", rec.Fence)
	fmt.Fprintf(w, "fingerprint  %s\n", rec.Fingerprint)
	fmt.Fprintf(w, "created      %s\n", stamp(rec.CreatedAt))
	if rec.Status == idem.StatusProcessing {
		fmt.Fprintf(w, "lease        %s\n", leaseState(rec.LeaseUntil))
	} else {
		fmt.Fprintf(w, "completed    %s\n", stamp(rec.CompletedAt))
	}
	fmt.Fprintf(w, "expires      %s\n", stamp(rec.ExpiresAt))
	if rec.Response == nil {
		return
	}
	resp := rec.Response
	size := fmt.Sprintf("%d bytes", len(resp.Body))
	if resp.BodyOmitted {
		size = "not kept (too large)"
	}
	fmt.Fprintf(w, "response     %d, body %s\n", resp.StatusCode, size)
	names := make([]string, 0, len(resp.Header))
	for name := range resp.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, v := range resp.Header[name] {
			fmt.Fprintf(w, "  %s: %s\n", printable(name), printable(v))
		}
	}
	if body && len(resp.Body) > 0 {
		fmt.Fprintln(w)
		if !isText(resp.Body) {
			// Binary, or bytes a terminal would act on (escape sequences
			// that set its title or rewrite the screen): shown in hex.
			fmt.Fprintln(w, "(not printable text: shown in hex)")
			_, _ = io.WriteString(w, hex.Dump(resp.Body))
			return
		}
		_, _ = w.Write(resp.Body)
		if resp.Body[len(resp.Body)-1] != '\n' {
			fmt.Fprintln(w)
		}
	}
}

// printable returns s as it is if it is printable text, else quoted with
// its control and invalid bytes escaped: what a record holds was written
// by others and must not drive the operator's terminal.
func printable(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) && r != '\t' {
			return strconv.Quote(s)
		}
	}
	return s
}

// isText reports whether b is UTF-8 text of printable characters, tabs
// and line ends (\n, \r\n) only.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	s := string(b)
	for i, r := range s {
		switch {
		case r == '\n' || r == '\t':
		case r == '\r' && i+1 < len(s) && s[i+1] == '\n':
		case !unicode.IsPrint(r):
			return false
		}
	}
	return true
}

func runEvict(e *env, r *recordFlags, yes, force bool) error {
	if err := noArgs(e); err != nil {
		return err
	}
	scope, err := r.resolve()
	if err != nil {
		return err
	}
	if r.key == "" {
		return usagef("-key is required: the idempotency key of the record to delete")
	}
	st, err := existingDB(e.ctx, storeFlags{name: "db", raw: r.db, cache: r.cache})
	if err != nil {
		return err
	}
	defer st.Close()
	rec, err := st.store.Get(e.ctx, scope, r.key)
	if errors.Is(err, idem.ErrNotFound) {
		return fmt.Errorf("no record for key %q in scope %q: nothing to delete (check -scope or -scope-header-value, and -key)", r.key, scope)
	}
	if err != nil {
		return storeErr(err)
	}
	printRecord(e.stdout, rec, false)
	if err := refuseInFlight(rec, force); err != nil {
		return err
	}
	if !yes {
		if !confirmed(e, "Delete this record?") {
			return errors.New("not deleted (answer y to delete, or give -yes)")
		}
		// The answer may have taken long: the record printed may have
		// changed, or its execution renewed its lease.
		now, err := st.store.Get(e.ctx, scope, r.key)
		if errors.Is(err, idem.ErrNotFound) {
			return errors.New("not deleted: the record is gone already (swept or deleted meanwhile)")
		}
		if err != nil {
			return storeErr(err)
		}
		if now.Owner != rec.Owner || now.Fence != rec.Fence {
			return changedSincePrinted(rec, now)
		}
		if err := refuseInFlight(now, force); err != nil {
			return err
		}
	}
	if cd, ok := st.store.(idem.ConditionalDeleter); ok {
		err = cd.DeleteIf(e.ctx, scope, r.key, rec.Owner, rec.Fence)
	} else {
		err = st.store.Delete(e.ctx, scope, r.key)
	}
	switch {
	case errors.Is(err, tieredstore.ErrCacheEntryKept):
		return storeErr(err)
	case errors.Is(err, idem.ErrNotFound):
		return errors.New("not deleted: the record is gone already (swept or deleted meanwhile)")
	case errors.Is(err, idem.ErrRecordChanged):
		now, gerr := st.store.Get(e.ctx, scope, r.key)
		if gerr != nil {
			return fmt.Errorf("not deleted: the record changed since it was printed (%v); run idem evict again to see it", err)
		}
		return changedSincePrinted(rec, now)
	case err != nil:
		return storeErr(err)
	}
	fmt.Fprintln(e.stdout, "deleted")
	return nil
}

// confirmed asks question on standard output and reports whether the
// answer read from standard input is y or yes.
func confirmed(e *env, question string) bool {
	fmt.Fprintf(e.stdout, "\n%s [y/N] ", question)
	line, _ := bufio.NewReader(e.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

// refuseInFlight refuses rec if it is in flight, unless force.
func refuseInFlight(rec idem.Record, force bool) error {
	if force || rec.Status != idem.StatusProcessing || !time.Now().Before(rec.LeaseUntil) {
		return nil
	}
	return fmt.Errorf("not deleted: the record is in flight (its lease runs until %s): its execution may still be running, and deleting the record would let a retry run the request again beside it; wait until the lease ends, or give -force", stamp(rec.LeaseUntil))
}

// changedSincePrinted is the error of an eviction whose record was
// replaced by now after it was printed as was.
func changedSincePrinted(was, now idem.Record) error {
	return fmt.Errorf("not deleted: the record changed since it was printed (fence %d then; now %s, fence %d, another execution's); run idem evict again to see it", was.Fence, now.Status, now.Fence)
}
