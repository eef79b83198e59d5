package idemcli

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/dsn"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/steps"
)

const opsHelp = `Usage: idem ops -db DSN [-state dead|waiting|running|done] [-n N]
       idem ops -db DSN [-scope S] -key K

idem ops shows the operations of package steps (multi-step operations
kept by sqlstore.StepJournal in idem_ops and idem_steps). Without -key it
lists at most -n operations in -state (dead by default: the ones that
failed every attempt and wait for an operator), least recently updated
first, one line each: scope, key, name, state, attempts, next attempt,
update time and the last attempt's error (escaped, and cut when long).

With -key it prints one operation: its state, attempts, times, last
error, and the steps it has checkpointed (name, size and time, and the
result when it is printable text; anything else in hex). A done
operation keeps no checkpoints.

idem retry makes a dead or waiting operation due now.

-db is the application's SQL database (sqlite:PATH,
postgres://user:pass@host:port/db, mysql://user:pass@host:port/db):
operations live in SQL only.`

const retryHelp = `Usage: idem retry -db DSN [-scope S] -key K [-yes]

idem retry makes a dead or waiting operation of package steps due now
(sqlstore.StepJournal's Retry): a dead one with its attempts counted from
0 again, so that it gets every attempt anew. The completer of an instance
that defines the operation (steps.Runner.Start, or Runner.Complete from a
job) runs it on its next pass, resuming after its last checkpoint; a
client's retry with the same key runs it at once.

It prints the operation and asks for confirmation on standard input
unless -yes is given; an answer other than y or yes changes nothing (exit
status 1). A running operation (an execution holds it, or the completer
takes it up when that execution died) and a done one (its answer is
stored) are refused with exit status 1: there is nothing to retry.

-db is the application's SQL database, as for idem ops.`

func init() {
	register("ops", &command{
		synopsis: "list operations of steps (the dead by default), or show one",
		help:     opsHelp,
		flags: func(fs *flag.FlagSet) func(*env) int {
			o := &opFlags{}
			o.declare(fs)
			state := fs.String("state", string(steps.StateDead), "without -key: the state of the operations listed: dead, waiting, running or done")
			n := fs.Int("n", 20, "without -key: how many operations to list")
			return func(e *env) int { return exit(e, "ops", runOps(e, o, steps.State(*state), *n)) }
		},
	})
	register("retry", &command{
		synopsis: "make a dead or waiting operation of steps due now",
		help:     retryHelp,
		flags: func(fs *flag.FlagSet) func(*env) int {
			o := &opFlags{}
			o.declare(fs)
			yes := fs.Bool("yes", false, "retry without asking")
			return func(e *env) int { return exit(e, "retry", runRetry(e, o, *yes)) }
		},
	})
}

// opFlags name one operation (or none, for ops's list).
type opFlags struct {
	db, scope, key string
}

func (o *opFlags) declare(fs *flag.FlagSet) {
	fs.StringVar(&o.db, "db", "", "the application's SQL database: a `DSN` (required)")
	fs.StringVar(&o.scope, "scope", "", "the operation's scope as stored (empty by default)")
	fs.StringVar(&o.key, "key", "", "the operation's idempotency key")
}

// journal opens the StepJournal of the database o.db names.
func (o *opFlags) journal(e *env) (*sqlstore.StepJournal, func(), error) {
	if dsn.IsRedis(o.db) {
		return nil, nil, usagef("-db %s is Redis, and operations of steps live in a SQL database only (sqlstore.StepJournal, next to the records): give -db the application's SQL database", dsn.Redact(o.db))
	}
	st, err := existingDB(e.ctx, storeFlags{name: "db", raw: o.db})
	if err != nil {
		return nil, nil, err
	}
	j, err := sqlstore.NewStepJournal(st.db, &sqlstore.Config{Dialect: st.dialect})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return j, func() { j.Close(); st.Close() }, nil
}

func runOps(e *env, o *opFlags, state steps.State, n int) error {
	if err := noArgs(e); err != nil {
		return err
	}
	if o.key == "" && o.scope != "" {
		return usagef("-key is required with -scope: the operation's idempotency key")
	}
	switch state {
	case steps.StateDead, steps.StateWaiting, steps.StateRunning, steps.StateDone:
	default:
		return usagef("-state %q: want dead, waiting, running or done", state)
	}
	if n <= 0 {
		return usagef("-n must be positive, e.g. -n 20")
	}
	j, closeAll, err := o.journal(e)
	if err != nil {
		return err
	}
	defer closeAll()
	if o.key != "" {
		op, err := getOp(e, j, o)
		if err != nil {
			return err
		}
		printOp(e.stdout, op, true)
		return nil
	}
	ops, err := j.List(e.ctx, state, n)
	if err != nil {
		return storeErr(err)
	}
	fmt.Fprintf(e.stdout, "%s operations (%d):\n", strings.ToUpper(string(state[:1]))+string(state[1:]), len(ops))
	if len(ops) == 0 {
		fmt.Fprintln(e.stdout, "  none")
	}
	for _, op := range ops {
		fmt.Fprintf(e.stdout, "  %s\n", opLine(op))
	}
	return nil
}

// getOp reads the operation o names, with its checkpoints.
func getOp(e *env, j *sqlstore.StepJournal, o *opFlags) (steps.Entry, error) {
	op, err := j.Get(e.ctx, o.scope, o.key)
	if errors.Is(err, idem.ErrNotFound) {
		return op, fmt.Errorf("no operation for key %q in scope %q (check -scope and -key; idem ops lists them)", o.key, o.scope)
	}
	return op, storeErr(err)
}

// maxErrorLine bounds the last error shown on an operation's line.
const maxErrorLine = 120

// opLine describes op on one line.
func opLine(op steps.Entry) string {
	return fmt.Sprintf("scope=%q key=%q name=%q %s attempts=%d next=%s updated=%s error=%q",
		op.Scope, op.Key, op.Name, op.State, op.Attempts, stamp(op.NextAt), stamp(op.UpdatedAt), cut(op.LastError, maxErrorLine))
}

// cut returns s cut to at most n bytes (at a rune's start), with an
// ellipsis if it was longer.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// maxResultShown bounds the bytes of a checkpoint's result printed.
const maxResultShown = 4096

// printOp prints op; the results of its checkpoints only if results.
func printOp(w io.Writer, op steps.Entry, results bool) {
	fmt.Fprintf(w, "scope        %q\n", op.Scope)
	fmt.Fprintf(w, "key          %q\n", op.Key)
	fmt.Fprintf(w, "name         %s\n", printable(op.Name))
	fmt.Fprintf(w, "state        %s\n", op.State)
	fmt.Fprintf(w, "attempts     %d\n", op.Attempts)
	fmt.Fprintf(w, "next attempt %s\n", nextAttempt(op))
	if op.LastError != "" {
		fmt.Fprintf(w, "last error   %s\n", printable(op.LastError))
	}
	fmt.Fprintf(w, "created      %s\n", stamp(op.CreatedAt))
	fmt.Fprintf(w, "updated      %s\n", stamp(op.UpdatedAt))
	if op.State == steps.StateDone {
		fmt.Fprintf(w, "expires      %s\n", stamp(op.ExpiresAt))
	}
	fmt.Fprintf(w, "fingerprint  %s\n", printable(string(op.Fingerprint)))
	fmt.Fprintf(w, "input        %d bytes\n", len(op.Input))
	fmt.Fprintf(w, "checkpoints  %d\n", len(op.Checkpoints))
	for _, c := range op.Checkpoints {
		fmt.Fprintf(w, "  %s  %d bytes  %s\n", printable(c.Step), len(c.Result), stamp(c.At))
		if !results || len(c.Result) == 0 {
			continue
		}
		if isText(c.Result) {
			_, _ = io.WriteString(w, indent(cut(string(c.Result), maxResultShown), "    "))
		} else {
			fmt.Fprintln(w, "    (not printable text: shown in hex)")
			_, _ = io.WriteString(w, indent(hex.Dump(c.Result[:min(len(c.Result), maxResultShown)]), "    "))
			if len(c.Result) > maxResultShown {
				fmt.Fprintf(w, "    (%d more bytes not shown)\n", len(c.Result)-maxResultShown)
			}
		}
	}
}

// nextAttempt says when the completer may take op up.
func nextAttempt(op steps.Entry) string {
	switch {
	case op.State == steps.StateDead:
		return "- (dead: idem retry makes it due)"
	case op.NextAt.IsZero():
		return "-"
	}
	d := time.Until(op.NextAt).Round(time.Millisecond)
	if d > 0 {
		return stamp(op.NextAt) + " (in " + d.String() + ")"
	}
	return stamp(op.NextAt) + " (due)"
}

// indent prefixes each line of s with prefix, and ends s with a newline.
func indent(s, prefix string) string {
	s = strings.TrimSuffix(s, "\n")
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix) + "\n"
}

func runRetry(e *env, o *opFlags, yes bool) error {
	if err := noArgs(e); err != nil {
		return err
	}
	if o.key == "" {
		return usagef("-key is required: the idempotency key of the operation to retry")
	}
	j, closeAll, err := o.journal(e)
	if err != nil {
		return err
	}
	defer closeAll()
	op, err := getOp(e, j, o)
	if err != nil {
		return err
	}
	printOp(e.stdout, op, false)
	if err := refuseUnretryable(op.State); err != nil {
		return err
	}
	if !yes {
		if !confirmed(e, "Retry this operation?") {
			return errors.New("not retried (answer y to retry, or give -yes)")
		}
	}
	switch err := j.Retry(e.ctx, o.scope, o.key); {
	case errors.Is(err, idem.ErrNotFound):
		return errors.New("not retried: the operation is gone (swept, or replaced and swept, meanwhile)")
	case errors.Is(err, steps.ErrNotRetryable):
		now, gerr := j.Get(e.ctx, o.scope, o.key)
		if gerr != nil {
			return fmt.Errorf("not retried: %w", err)
		}
		return refuseUnretryable(now.State)
	case err != nil:
		return storeErr(err)
	}
	was := fmt.Sprintf("it was waiting; its %d attempts are kept", op.Attempts)
	if op.State == steps.StateDead {
		was = "it was dead; its attempts count from 0 again"
	}
	fmt.Fprintf(e.stdout, "retried: the operation is waiting and due now (%s); the completer of an instance that defines %s runs it on its next pass\n",
		was, printable(op.Name))
	return nil
}

// refuseUnretryable refuses an operation in state: running or done ones
// have nothing to retry.
func refuseUnretryable(state steps.State) error {
	switch state {
	case steps.StateRunning:
		return fmt.Errorf("not retried: the operation is running (an execution holds it, or the completer takes it up at its next attempt if that execution died): %w", steps.ErrNotRetryable)
	case steps.StateDone:
		return fmt.Errorf("not retried: the operation is done (its answer is stored in its record): %w", steps.ErrNotRetryable)
	}
	return nil
}
