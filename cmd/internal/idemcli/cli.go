// Package idemcli is the idem command: probe, proxy, migrate, sweep,
// inspect, evict, ops, retry and help. cmd/idem is a thin main around Main.
package idemcli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// env is what a command gets: its arguments (after the command's name)
// and the process's streams.
type env struct {
	ctx    context.Context
	args   []string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// jsonErrors makes fail print the error as JSON on stdout too (a
	// command's -json).
	jsonErrors bool
}

// command is one subcommand of idem.
type command struct {
	// synopsis is one line for idem help.
	synopsis string
	// help is the long text of idem help NAME (the flags follow it).
	help string
	// flags declares the command's flags on fs and returns the function
	// that runs it once they are parsed.
	flags func(fs *flag.FlagSet) func(e *env) int
}

// commands are idem's subcommands, by name. Each lives in a file of its
// own (probe.go, proxy.go, store.go).
var commands = map[string]*command{}

func register(name string, c *command) {
	if _, dup := commands[name]; dup {
		panic("idemcli: command " + name + " registered twice")
	}
	commands[name] = c
}

// usageError is a bad flag or argument: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// kindError is an error with a kind, for -json: {"kind": …}.
type kindError struct {
	kind string
	err  error
}

func (e *kindError) Error() string { return e.err.Error() }
func (e *kindError) Unwrap() error { return e.err }

// errorKind returns err's kind for -json: "usage" for a usageError, the
// kind of a kindError, else "error".
func errorKind(err error) string {
	var u *usageError
	var k *kindError
	switch {
	case errors.As(err, &u):
		return "usage"
	case errors.As(err, &k):
		return k.kind
	}
	return "error"
}

// writeJSONError prints err as {"ok": false, "error": {kind, message}}.
func writeJSONError(w io.Writer, err error) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	type jsonError struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
	}
	_ = enc.Encode(struct {
		OK    bool      `json:"ok"`
		Error jsonError `json:"error"`
	}{Error: jsonError{Kind: errorKind(err), Message: err.Error()}})
}

// usagef returns a usageError; its text names the flag and the fix.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// Main runs idem with args (without the program name) and returns the
// exit status.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		return help(rest, stdout, stderr)
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "idem: unknown command %q; run 'idem help' for the list\n", name)
		return exitUsage
	}
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := c.flags(fs)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout, name, c)
			return exitOK
		}
		err = usagef("%v; run 'idem help %s'", err, name)
		if fs.Lookup("json") != nil && jsonAmong(rest) {
			writeJSONError(stdout, err)
		}
		fmt.Fprintf(stderr, "idem %s: %v\n", name, err)
		return exitUsage
	}
	return run(&env{ctx: ctx, args: fs.Args(), stdin: stdin, stdout: stdout, stderr: stderr})
}

// jsonAmong reports whether args ask for -json: the flag parser stops at
// a bad flag, and a -json after it must still have its error as JSON (a
// CI job reads standard output).
func jsonAmong(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "json" {
			continue
		}
		if b, err := strconv.ParseBool(value); !hasValue || err == nil && b {
			return true
		}
	}
	return false
}

// fail reports err from command name and returns its exit status: 2 for a
// usageError, 1 otherwise.
func fail(e *env, name string, err error) int {
	if e.jsonErrors {
		writeJSONError(e.stdout, err)
	}
	fmt.Fprintf(e.stderr, "idem %s: %v\n", name, err)
	var u *usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	return exitFail
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "idem makes the effects of HTTP APIs happen once, and checks that they do.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: idem COMMAND [flags] [arguments]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].synopsis)
	}
	fmt.Fprintf(w, "  %-9s %s\n", "help", "explain a command and its flags")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'idem help COMMAND' for a command's flags.")
}

func help(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok || len(args) > 1 {
		fmt.Fprintf(stderr, "idem help: unknown command %q; run 'idem help' for the list\n", strings.Join(args, " "))
		return exitUsage
	}
	printHelp(stdout, args[0], c)
	return exitOK
}

func printHelp(w io.Writer, name string, c *command) {
	fmt.Fprintln(w, strings.TrimSpace(c.help))
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	c.flags(fs)
	has := false
	fs.VisitAll(func(*flag.Flag) { has = true })
	if has {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Flags:")
		printFlags(w, fs)
	}
}

// helpWidth is the width of help's lines.
const helpWidth = 80

// printFlags prints fs's flags as flag.PrintDefaults does (the name and
// the argument's name, then the usage and the default), the usage wrapped
// in lines of at most helpWidth columns.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintln(w, line)
		if def := f.DefValue; def != "" && def != "0" && def != "0s" && def != "false" {
			if fmt.Sprintf("%T", f.Value) == "*flag.stringValue" {
				def = strconv.Quote(def)
			}
			usage += " (default " + def + ")"
		}
		io.WriteString(w, wrap(usage, "        ", helpWidth))
	})
}

// validHeaderName reports whether s is an HTTP field name (an RFC 9110
// token).
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}
