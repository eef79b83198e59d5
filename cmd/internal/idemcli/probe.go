package idemcli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/cmd/internal/probe"
)

func init() {
	register("probe", &command{
		synopsis: "check an API's Idempotency-Key semantics",
		help:     probeHelp(),
		flags:    probeFlags,
	})
}

const probeIntro = `Usage: idem probe [flags] URL

idem probe checks that an API honours the Idempotency-Key header. It sends
the request you describe as curl would (-X, -H, -d) with fresh keys, the way
a retrying client does: concurrent duplicates, sequential retries, the key
reused with another body, keys missing, malformed, overlong, quoted or
spelled in another case. Each check is reported pass, fail, warning or
n/a (not applicable), with what the API answered and where the expectation
comes from. Flags may come before or after the URL.

Checks are graded in two. The core is the draft's MUST and SHOULD
(draft-ietf-httpapi-idempotency-key-header-07): a duplicate executes once
(§2.6), a retry gets the first answer again (§2.6), the key reused with
another payload is refused with 422 (§2.2, §2.7), concurrent duplicates
do not execute twice (§2.7), a malformed or missing key is refused with
400 (§2.1, §2.7, §5). A replay is recognised by its answer, the first
answer again; the draft defines no marker header, and a payload's
fingerprint may be a checksum of its raw bytes (§2.4). A profile is a house
style on top of the core:

  stripe           replays marked Idempotent-Replayed: true, 409 to
                   concurrent duplicates, a fingerprint insensitive to
                   JSON member order
  strict-keys      a bare key names the key its quoted form does (the
                   draft's value is a quoted sf-string, §2.1); empty and
                   non-UTF-8 keys refused with 400
  retry-safe       a 5xx is not kept, so a retry runs again; a 409 says
                   when to retry (Retry-After)
  problem-details  the refusals of a key (400, 409, 422) are RFC 9457
                   problem details

Every profile's checks run and are reported; only -profile makes them
decide the exit status. A warning is an answer the draft allows but that
weakens the protection (a lenient key validation, a key space shared
between callers): it fails nothing.

Some checks need to be told more about the API: -require-key (keys are
required: a keyless request must be refused), -H2 (a second caller, whose
requests must never get the first caller's answers), -d4xx and -d5xx
(bodies the API refuses, and fails), -retention (how long keys are kept:
the run then lasts that long). Without them those checks are n/a.

The request given must be one the API accepts (2xx) and executes: give its
authentication and identity with -H and its body with -d. With -effect-url
and -effect-json-path the probe also reads a count the request moves (the
caller's orders, say) before and after each check, and fails a check whose
effect moved otherwise than the answers show (a 2xx answer is an execution
unless it repeats an earlier answer under its key or is marked a replay):
answers alone cannot tell ten executions from one when they carry the same
bytes. The count must
move for nobody else while the probe runs: give it a user of its own.

Against shopd (cmd/shopd), as user 42, with user 43 as the second caller:

  idem probe -H 'X-User-ID: 42' -H2 'X-User-ID: 43' -require-key \
    -d '{"sku":"BOOK-1","quantity":1}' \
    -d4xx '{"sku":"NO-SUCH-SKU","quantity":1}' \
    -effect-url 'http://127.0.0.1:8080/orders?limit=500' \
    -effect-json-path 'orders.#' \
    http://127.0.0.1:8080/orders

Keys are version 4 UUIDs whose first group is the run's id (36 bytes, the
form most APIs take): runs never meet each other's records.

Checks, core first, then each profile's. "draft §N" is a section of
draft-ietf-httpapi-idempotency-key-header-07; "Stripe" is Stripe's documented
practice for idempotent requests (stripe.com/docs/api/idempotent_requests).
`

const probeOutro = `
-effect-json-path selects an integer in the effect's JSON answer: member
names and array indexes separated by dots (count, data.total, items.0.qty),
and a last segment # for the length of an array: orders.# counts shopd's
GET /orders, # alone a top-level array.

-d and -d4xx take the body itself, @FILE for a file's bytes (sent as they
are, like curl --data-binary) or @- for standard input. With a body and no
Content-Type among the -H headers, the probe sends application/json for a
JSON body and application/x-www-form-urlencoded otherwise (curl's default).
An Accept-Encoding among the -H headers (as a browser's "Copy as cURL"
gives) is not sent: the probe asks for gzip and reads answers decoded.

-H2 takes 'Name: value' like -H (repeatable): each replaces the -H header
of that name for the second caller, and the -effect-header (or -H) one
for the second caller's reads of the effect.

Output: the checks on standard output, core first, then each profile, in
lines of at most 80 columns (and a progress bar on standard error when it
is a terminal and the run lasts over a second); -json prints the report as
JSON instead: {url, method, key_header, run_id, concurrency, checks: [{id,
title, grade: "core"|"profile", profile, status: "pass"|"fail"|"n/a"|
"warning", reason, source, requests, executions, other_executions,
effect_delta}], effect: {url, path, before, after, expected}, requests,
passed, failed, not_applicable, warnings, core_ok, profiles: [{name,
required, ok, failed}], ok, duration_ms}. When the probe cannot run, -json
prints {ok: false, error: {kind, message}} (kind: usage, not_accepted,
no_answer, effect, interrupted or error) with the exit status below, and
the message on standard error too.

Exit status: 0 when the core passed (a profile's failures are reported
with a note unless -profile requires it); 1 when a core check failed or
the probe could not run (the API did not accept the first request, the
effect could not be read); 2 for bad flags or arguments; 3 when the core
passed but a profile that -profile requires failed.`

func probeHelp() string {
	var b strings.Builder
	b.WriteString(probeIntro)
	for _, profile := range append([]string{""}, probe.Profiles...) {
		if profile == "" {
			b.WriteString("\nCore checks:\n")
		} else {
			fmt.Fprintf(&b, "\nChecks of the profile %s:\n", profile)
		}
		for _, c := range probe.Checks {
			if c.Profile != profile {
				continue
			}
			fmt.Fprintf(&b, "\n  %s (%s)\n", c.ID, c.Source)
			b.WriteString(wrap(strings.ToUpper(c.Title[:1])+c.Title[1:]+". "+c.Explain, "      ", 78))
		}
	}
	b.WriteString(probeOutro)
	return b.String()
}

// wrap fills text into lines of at most width columns, each starting with
// indent. A word longer than a line (a URL, an answer's body without
// spaces) is cut across lines.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	start := utf8.RuneCountInString(indent)
	room := max(width-start, 1)
	line, cols := indent, start
	for _, w := range strings.Fields(text) {
		for utf8.RuneCountInString(w) > room {
			if cols > start {
				b.WriteString(line + "\n")
				line, cols = indent, start
			}
			cut := 0
			for i := 0; i < room; i++ {
				_, size := utf8.DecodeRuneInString(w[cut:])
				cut += size
			}
			b.WriteString(indent + w[:cut] + "\n")
			w = w[cut:]
		}
		n := utf8.RuneCountInString(w)
		if cols > start && cols+1+n > width {
			b.WriteString(line + "\n")
			line, cols = indent, start
		}
		if cols > start {
			line += " "
			cols++
		}
		line += w
		cols += n
	}
	if cols > start {
		b.WriteString(line + "\n")
	}
	return b.String()
}

// headerFlags collects repeated 'Name: value' flags.
type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// probeOptions are idem probe's flags.
type probeOptions struct {
	method, data, data4xx, data5xx, keyHeader string
	headers, headers2, effectHeaders          headerFlags
	n, maxKey                                 int
	timeout, retention                        time.Duration
	jsonOut, insecure, requireKey             bool
	profiles                                  string
	effectURL, effectPath                     string
	set                                       map[string]bool
}

func probeFlags(fs *flag.FlagSet) func(*env) int {
	o := &probeOptions{}
	fs.StringVar(&o.method, "X", http.MethodPost, "request `METHOD` (POST, PATCH, PUT, DELETE; not GET)")
	fs.Var(&o.headers, "H", "request header `'Name: value'`, sent with every request (repeatable): authentication, identity, Content-Type")
	fs.StringVar(&o.data, "d", "", "request body: `DATA`, @FILE or @- (standard input); a request the API accepts and executes")
	fs.StringVar(&o.data4xx, "d4xx", "", "a body the API refuses with a 4xx while running it (an unknown product; not a validation error), other than 409 (`DATA`, @FILE or @-), for the stored-4xx check (none: n/a)")
	fs.StringVar(&o.data5xx, "d5xx", "", "a body the API answers with a 5xx (`DATA`, @FILE or @-), for the released-5xx check (none: n/a)")
	fs.Var(&o.headers2, "H2", "header `'Name: value'` of a second caller, replacing the -H header of that name (repeatable), for the scoped-keys check (none: n/a)")
	fs.BoolVar(&o.requireKey, "require-key", false, "the API requires a key: a request without one must be refused with 400 (without: n/a when it runs)")
	fs.DurationVar(&o.retention, "retention", 0, "how long the API keeps a key (24h), for the expiry check: the run lasts that long (0: n/a)")
	fs.IntVar(&o.n, "n", probe.DefaultConcurrency, "concurrent requests with one key (2 to 1000)")
	fs.StringVar(&o.keyHeader, "header", probe.DefaultKeyHeader, "`NAME` of the key's request header")
	fs.IntVar(&o.maxKey, "max-key", probe.DefaultMaxKeyLen, "longest key in bytes the API takes; the overlong check sends one byte more")
	fs.DurationVar(&o.timeout, "timeout", probe.DefaultTimeout, "bound of each request")
	fs.StringVar(&o.profiles, "profile", "", "`NAMES` of profiles to require, comma-separated: "+strings.Join(probe.Profiles, ", "))
	fs.BoolVar(&o.jsonOut, "json", false, "print the report as JSON (for CI) instead of a table")
	fs.StringVar(&o.effectURL, "effect-url", "", "`URL` whose JSON answer (to GET) holds a count the request moves, read before and after each check")
	fs.StringVar(&o.effectPath, "effect-json-path", "", "`PATH` of the count in -effect-url's answer: count, data.total, orders.# (an array's length)")
	fs.Var(&o.effectHeaders, "effect-header", "header `'Name: value'` of the effect's GET (repeatable; default: the -H headers)")
	fs.BoolVar(&o.insecure, "k", false, "do not verify the server's TLS certificate (same as -insecure)")
	fs.BoolVar(&o.insecure, "insecure", false, "do not verify the server's TLS certificate")
	return func(e *env) int {
		cfg, err := o.config(fs, e)
		// -json may follow the URL: config parsed it.
		e.jsonErrors = o.jsonOut
		if err != nil {
			return fail(e, "probe", err)
		}
		return runProbe(e, cfg, o.jsonOut)
	}
}

// config parses what follows the first flags (the URL, and flags after
// it) and builds the probe's Config.
func (o *probeOptions) config(fs *flag.FlagSet, e *env) (*probe.Config, error) {
	args := e.args
	var target string
	for len(args) > 0 {
		if target != "" {
			return nil, usagef("one URL only; %q follows %q (quote a URL holding spaces or &)", args[0], target)
		}
		target = args[0]
		if err := fs.Parse(args[1:]); err != nil {
			o.jsonOut = o.jsonOut || jsonAmong(args[1:])
			if errors.Is(err, flag.ErrHelp) {
				return nil, usagef("-h after the URL: run 'idem help probe'")
			}
			return nil, usagef("%v; run 'idem help probe'", err)
		}
		args = fs.Args()
	}
	if target == "" {
		return nil, usagef("no URL: give the endpoint to probe, idem probe [flags] URL (run 'idem help probe')")
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	cfg := &probe.Config{
		URL:         target,
		Method:      o.method,
		Concurrency: o.n,
		KeyHeader:   o.keyHeader,
		MaxKeyLen:   o.maxKey,
		Timeout:     o.timeout,
		EffectURL:   o.effectURL,
		EffectPath:  o.effectPath,
		Insecure:    o.insecure,
		KeyRequired: o.requireKey,
		Retention:   o.retention,
	}
	for _, name := range strings.Split(o.profiles, ",") {
		if name = strings.TrimSpace(name); name != "" {
			cfg.Profiles = append(cfg.Profiles, name)
		}
	}
	var err error
	if cfg.Header, err = parseHeaders("-H", o.headers); err != nil {
		return nil, err
	}
	if len(o.headers2) > 0 {
		if cfg.OtherHeader, err = parseHeaders("-H2", o.headers2); err != nil {
			return nil, err
		}
	}
	if len(o.effectHeaders) > 0 {
		if cfg.EffectHeader, err = parseHeaders("-effect-header", o.effectHeaders); err != nil {
			return nil, err
		}
	}
	stdinUsed := false
	if o.set["d"] {
		if cfg.Body, err = readData("-d", o.data, e.stdin, &stdinUsed); err != nil {
			return nil, err
		}
	}
	if o.set["d4xx"] {
		if cfg.RefusedBody, err = readData("-d4xx", o.data4xx, e.stdin, &stdinUsed); err != nil {
			return nil, err
		}
	}
	if o.set["d5xx"] {
		if cfg.ServerErrorBody, err = readData("-d5xx", o.data5xx, e.stdin, &stdinUsed); err != nil {
			return nil, err
		}
	}
	if o.timeout <= 0 {
		return nil, usagef("-timeout %v: give a positive duration (30s)", o.timeout)
	}
	if o.keyHeader == "" {
		return nil, usagef("-header '': give the name of the key's header (%s)", probe.DefaultKeyHeader)
	}
	if o.maxKey == 0 {
		return nil, usagef("-max-key 0: give the longest key the API takes, in bytes (%d)", probe.DefaultMaxKeyLen)
	}
	switch {
	case o.effectURL != "" && o.effectPath == "":
		return nil, usagef("-effect-url without -effect-json-path: give the count's path in its JSON (count, data.total, orders.#)")
	case o.effectURL == "" && o.effectPath != "":
		return nil, usagef("-effect-json-path without -effect-url: give the URL whose JSON holds the count")
	case o.effectURL == "" && len(o.effectHeaders) > 0:
		return nil, usagef("-effect-header without -effect-url: give the URL whose JSON holds the count, or drop -effect-header")
	}
	return cfg, nil
}

// parseHeaders parses 'Name: value' flags.
func parseHeaders(flagName string, values []string) (http.Header, error) {
	h := http.Header{}
	for _, v := range values {
		name, value, ok := strings.Cut(v, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, usagef("%s %q: give a header as 'Name: value'", flagName, v)
		}
		if !validHeaderName(name) {
			return nil, usagef("%s %q: %q is not a header name (letters, digits and !#$%%&'*+-.^_`|~)", flagName, v, name)
		}
		h.Add(name, strings.TrimSpace(value))
	}
	return h, nil
}

// readData returns a -d value: the data itself, a file's bytes (@FILE) or
// standard input's (@-, once).
func readData(flagName, v string, stdin io.Reader, stdinUsed *bool) ([]byte, error) {
	file, ok := strings.CutPrefix(v, "@")
	switch {
	case !ok:
		return []byte(v), nil
	case file == "":
		return nil, usagef("%s @: give @FILE, @- for standard input, or the body itself", flagName)
	case file == "-":
		if *stdinUsed {
			return nil, usagef("%s @-: standard input is read by another flag already; give one of them @FILE", flagName)
		}
		*stdinUsed = true
		if stdin == nil {
			return nil, usagef("%s @-: no standard input; give @FILE or the body itself", flagName)
		}
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, usagef("%s @-: reading standard input: %v", flagName, err)
		}
		return b, nil
	default:
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usagef("%s @%s: %v; give a readable file, @- for standard input, or the body itself", flagName, file, err)
		}
		return b, nil
	}
}

// configFlags names the flag of each probe.Config field, for errors.
var configFlags = map[string]string{
	"URL":          "URL",
	"Method":       "-X",
	"Header":       "-H",
	"Concurrency":  "-n",
	"KeyHeader":    "-header",
	"MaxKeyLen":    "-max-key",
	"Timeout":      "-timeout",
	"EffectURL":    "-effect-url",
	"EffectPath":   "-effect-json-path",
	"EffectHeader": "-effect-header",
	"Profiles":     "-profile",
	"OtherHeader":  "-H2",
	"Retention":    "-retention",
}

func runProbe(e *env, cfg *probe.Config, jsonOut bool) int {
	bar := newProgressBar(e.stderr, isTerminal(e.stderr))
	cfg.Progress = bar.update
	rep, err := probe.Run(e.ctx, cfg)
	bar.clear()
	if err != nil {
		return fail(e, "probe", explainProbeError(cfg, err))
	}
	if jsonOut {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			e.jsonErrors = false // standard output is what failed
			return fail(e, "probe", err)
		}
	} else {
		printReport(e.stdout, rep)
	}
	switch {
	case !rep.CoreOK:
		return exitFail
	case !rep.OK:
		return exitProfile
	}
	return exitOK
}

// exitProfile is idem probe's exit status when the core passed but a
// required profile failed.
const exitProfile = 3

// explainProbeError names the flag behind err and the fix, and says its
// kind for -json.
func explainProbeError(cfg *probe.Config, err error) error {
	var ce *probe.ConfigError
	var na *probe.NotAcceptedError
	var ee *probe.EffectError
	switch {
	case errors.As(err, &ce):
		return usagef("%s: %s", configFlags[ce.Field], ce.Msg)
	case errors.As(err, &na) && na.Err != nil:
		return &kindError{"no_answer", fmt.Errorf("%s %s: %w; check the URL and that the server is up (-timeout bounds each request)", cfg.Method, cfg.URL, err)}
	case errors.As(err, &na) && na.Location != "":
		return &kindError{"not_accepted", fmt.Errorf("%s %s: %w", cfg.Method, cfg.URL, err)}
	case errors.As(err, &na):
		return &kindError{"not_accepted", fmt.Errorf("%s %s: %w; the checks need a request the API accepts (2xx): give its headers with -H (authentication, identity, Content-Type) and its body with -d", cfg.Method, cfg.URL, err)}
	case errors.As(err, &ee):
		return &kindError{"effect", fmt.Errorf("-effect-url: %w; give -effect-url a URL that answers GET with JSON holding the count at -effect-json-path (and -effect-header when it needs headers other than -H)", err)}
	case errors.Is(err, context.Canceled):
		return &kindError{"interrupted", errors.New("interrupted; no verdict")}
	}
	return err
}

// reportWidth is the width of printReport's lines.
const reportWidth = 80

func printReport(w io.Writer, rep *probe.Report) {
	group := func(title string, pick func(r *probe.Result) bool) {
		fmt.Fprintln(w, title)
		for i := range rep.Checks {
			r := &rep.Checks[i]
			if !pick(r) {
				continue
			}
			fmt.Fprintf(w, "  %-7s %-21s %s\n", r.Status, r.ID, r.Source)
			b := wrap(r.Reason, "          ", reportWidth)
			io.WriteString(w, b)
		}
	}
	group("CORE (the draft's MUST and SHOULD)", func(r *probe.Result) bool { return r.Grade == probe.Core })
	for _, pr := range rep.Profiles {
		how := "not required; -profile " + pr.Name + " requires it"
		if pr.Required {
			how = "required"
		}
		fmt.Fprintln(w)
		group("PROFILE "+pr.Name+" ("+how+")", func(r *probe.Result) bool { return r.Profile == pr.Name })
	}
	verdict := "PASS"
	if !rep.CoreOK {
		verdict = "FAIL"
	}
	warnings := "warnings"
	if rep.Warnings == 1 {
		warnings = "warning"
	}
	fmt.Fprintf(w, "\n%s: core %s; %d passed, %d failed, %d %s, %d n/a\n",
		verdict, map[bool]string{true: "passed", false: "failed"}[rep.CoreOK], rep.Passed, rep.Failed, rep.Warnings, warnings, rep.NA)
	for _, pr := range rep.Profiles {
		switch {
		case pr.OK:
		case pr.Required:
			fmt.Fprintf(w, "PROFILE FAIL: %s (required): %s\n", pr.Name, strings.Join(pr.Failed, ", "))
		default:
			io.WriteString(w, wrap(fmt.Sprintf("Note: the API differs from profile %s (%s); the draft allows it, and the exit status ignores it without -profile %s.",
				pr.Name, strings.Join(pr.Failed, ", "), pr.Name), "", reportWidth))
		}
	}
	io.WriteString(w, wrap(fmt.Sprintf("%s %s, %d requests in %v, keys %s-…", rep.Method, rep.URL, rep.Requests,
		(time.Duration(rep.DurationMS)*time.Millisecond).Round(time.Millisecond), rep.RunID), "", reportWidth))
	if rep.CoreOK && rep.Effect == nil {
		io.WriteString(w, wrap("This PASS reads answers only: without -effect-url the probe cannot tell an API that runs a "+
			"retry again and answers it as a replay from one that runs it once. Give -effect-url and "+
			"-effect-json-path (a count the request moves) to check the effect itself.", "", reportWidth))
	}
}

// progressBar draws the probe's progress on a terminal once the run has
// lasted a second; elsewhere it draws nothing.
type progressBar struct {
	w     io.Writer
	on    bool
	start time.Time
	now   func() time.Time
	shown bool
}

func newProgressBar(w io.Writer, on bool) *progressBar {
	return &progressBar{w: w, on: on, start: time.Now(), now: time.Now}
}

func (b *progressBar) update(done, total int) {
	if !b.on || b.now().Sub(b.start) < time.Second {
		return
	}
	total = max(total, done, 1)
	const width = 30
	fill := width * done / total
	fmt.Fprintf(b.w, "\rprobing [%s%s] %d/%d", strings.Repeat("#", fill), strings.Repeat(".", width-fill), done, total)
	b.shown = true
}

// clear erases the bar, if it was drawn.
func (b *progressBar) clear() {
	if b.shown {
		fmt.Fprint(b.w, "\r\033[K")
		b.shown = false
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
