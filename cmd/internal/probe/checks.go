package probe

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Info describes a check.
type Info struct {
	// ID is the check's stable name, in reports and -json.
	ID string
	// Title says what the check expects, in a line.
	Title string
	// Source is where the expectation comes from: "draft §N" is a section
	// of draft-ietf-httpapi-idempotency-key-header-07, "Stripe" is
	// Stripe's documented practice (stripe.com/docs/api/idempotent_requests).
	Source string
	// Explain says what the check sends and what passes, for idem help probe.
	Explain string
	// Profile names the check's profile (of Profiles); "" makes it a core
	// check, one of the draft's MUST and SHOULD.
	Profile string

	run func(ctx context.Context, c *check) (Status, string, error)
	// start, when not nil, sends the check's first requests right after
	// the first check (a check that spans the run: expiry).
	start func(ctx context.Context, c *check) error
}

// Grade returns Core, or Profile for a check of a profile.
func (i *Info) Grade() string {
	if i.Profile == "" {
		return Core
	}
	return Profile
}

func (i *Info) result() Result {
	return Result{ID: i.ID, Title: i.Title, Source: i.Source, Grade: i.Grade(), Profile: i.Profile}
}

// Checks are the checks, in the order they run and are reported. A
// profile's check that judges a core check's answers follows it and sends
// nothing of its own.
var Checks = []Info{
	{
		ID:     "retry-replay",
		Title:  "sequential retries replay the first answer",
		Source: "draft §2.6",
		Explain: "Sends the request with a fresh key, then retries it twice, one after the other. " +
			"Each retry must get the first answer again byte for byte (status, Content-Type, Location, body): " +
			"that is how a replay is recognised. A marker header (Idempotent-Replayed, Idempotency-Replayed, " +
			"X-Idempotent-Replayed, X-Idempotency-Replayed) is reported, not required: the draft defines none. " +
			"A retry answered 409 is retried after its Retry-After (at most 8 times). " +
			"The first request must be answered 2xx: if it is not, the probe stops and says what it got.",
		run: checkRetryReplay,
	},
	{
		ID:      "replay-marker",
		Profile: "stripe",
		Title:   "replays are marked Idempotent-Replayed: true",
		Source:  "Stripe",
		Explain: "Judges the replays of retry-replay and stored-4xx (it sends nothing): each must carry " +
			"Idempotent-Replayed: true, Stripe's marker, so that a client can tell a replay from a new " +
			"execution without comparing bodies. Not applicable when no answer was a replay.",
		run: checkReplayMarker,
	},
	{
		ID:     "concurrent",
		Title:  "N concurrent requests with one key execute once",
		Source: "draft §2.6, §2.7",
		Explain: "Sends -n requests with one fresh key at once. Exactly one may execute; every other one must " +
			"be a replay of its answer (the same bytes, or marked) or 409 Conflict. Unmarked 2xx answers with " +
			"different bodies are executions of their own.",
		run: checkConcurrent,
	},
	{
		ID:      "concurrent-409",
		Profile: "stripe",
		Title:   "concurrent duplicates get 409, not a wait",
		Source:  "Stripe; draft §2.7",
		Explain: "Judges the concurrent check's answers (it sends nothing): Stripe answers a duplicate that " +
			"arrives while the first runs with 409. A warning when none got 409 (the API waits and replays, " +
			"which the probe cannot tell from the first ending before the others arrived).",
		run: checkConcurrent409,
	},
	{
		ID:     "mismatch-422",
		Title:  "the same key with another body is refused with 422",
		Source: "draft §2.2, §2.7",
		Explain: "Sends another body with a fresh key (a JSON object with its first integer member plus one; " +
			"when the API refuses that on its own, with its first string member changed, then with the member " +
			"\"idem_probe\" added; a form with the field idem_probe=…), then the body under the same key. The " +
			"second must be 422 Unprocessable Content, not executed and not a replay of the first. The other body " +
			"goes first so that the 422 cannot be a refusal of a body the API refuses under any key. Not " +
			"applicable when the API accepts none of the other bodies.",
		run: checkMismatch,
	},
	{
		ID:     "after-mismatch",
		Title:  "after a 422 the original request still replays",
		Source: "draft §2.7; Stripe",
		Explain: "After the mismatch check's 422, sends the key's first request (the other body) again: it must " +
			"replay the first answer (a refused request does not poison the key's record). Not applicable when " +
			"the mismatch check got no 422.",
		run: checkAfterMismatch,
	},
	{
		ID:     "concurrent-mismatch",
		Title:  "another body while the first runs is refused, not executed",
		Source: "draft §2.6, §2.7",
		Explain: "Sends -n requests with one fresh key at once, half with the body and half with another body " +
			"(the one mismatch-422 found the API accepts). One request executes; the others with its body must " +
			"replay it or get 409, and those with the other body must get 409 or 422: never executed, never given " +
			"the other body's answer. When the API accepts none of the other bodies on their own, their refusal " +
			"(the same answer as under a fresh key) passes too.",
		run: checkConcurrentMismatch,
	},
	{
		ID:      "retry-after",
		Profile: "retry-safe",
		Title:   "a 409 to a request in flight carries Retry-After",
		Source:  "RFC 9110 §10.2.3; idem",
		Explain: "Judges the 409s of the concurrent checks (it sends nothing): each must carry Retry-After " +
			"(seconds or a date), so that a client knows when the first request may be done; the value is " +
			"reported against the time the executing request took. Not applicable when no request got 409 " +
			"(the API waited and replayed, or the first ended before the others came).",
		run: checkRetryAfter,
	},
	{
		ID:      "reordered-json",
		Profile: "stripe",
		Title:   "the same JSON with its members reordered is the same request",
		Source:  "Stripe; draft §2.4",
		Explain: "Sends a JSON object body with a fresh key, then its members in reverse order under the same " +
			"key: to a fingerprint over the payload's fields that is the same request, so it must replay the " +
			"first answer, not 422. The draft allows a checksum of the raw payload too (§2.4): a core API may " +
			"fail this. Not applicable when the body is not a JSON object of two members or more.",
		run: checkReordered,
	},
	{
		ID:     "two-keys",
		Title:  "two keys with the same body execute twice",
		Source: "draft §2.2; Stripe",
		Explain: "Sends the same body under two fresh keys: the key, not the body, names a request, so both must " +
			"execute (2xx, neither marked as a replay).",
		run: checkTwoKeys,
	},
	{
		ID:     "header-case",
		Title:  "the key's header name is case-insensitive",
		Source: "RFC 9110 §5.1",
		Explain: "Sends a fresh key under the header name in lower case (as HTTP/2 does), then the same key under " +
			"the name in upper case: the first must execute, the second replay it.",
		run: checkHeaderCase,
	},
	{
		ID:     "quoted-key",
		Title:  "a quoted key (the draft's syntax) is de-duplicated with itself",
		Source: "draft §2.1; RFC 8941 §3.3.3",
		Explain: "Sends a fresh key as an sf-string (\"key\", the draft's syntax) twice: the first must " +
			"execute, the second replay it, neither refused.",
		run: checkQuoted,
	},
	{
		ID:      "bare-key",
		Profile: "strict-keys",
		Title:   "a bare key names the key its quoted form does",
		Source:  "draft §2.1; Stripe",
		Explain: "After quoted-key, sends its key bare (key, as Stripe's clients do): it must replay the " +
			"quoted key's answer. The draft's value is an sf-string, so a bare key is the server's leniency; " +
			"taking it as another key, or refusing it, is reported here.",
		run: checkBare,
	},
	{
		ID:     "missing-key",
		Title:  "a request without a key is refused with 400 where a key is required",
		Source: "draft §2.7",
		Explain: "Sends the request without the key header: 400 passes. 2xx fails with -require-key (the API " +
			"documents the key as required) and is not applicable without it (the API runs keyless requests " +
			"unguarded: a client that forgets the key gets no protection); anything else fails.",
		run: checkMissing,
	},
	{
		ID:     "malformed-key",
		Title:  "a malformed key is refused with 400",
		Source: "draft §2.1, §5",
		Explain: "Sends three malformed keys: one with a tab inside (a control character, never an sf-string), " +
			"an empty value and a value that is not UTF-8. The first must be 400. The other two taken is a " +
			"warning (a lenient validation, not an idempotency failure).",
		run: checkMalformed,
	},
	{
		ID:      "strict-key-validation",
		Profile: "strict-keys",
		Title:   "empty and non-UTF-8 keys are refused with 400",
		Source:  "draft §2.1, §5",
		Explain: "Judges malformed-key's answers to the empty and the non-UTF-8 key (it sends nothing): " +
			"each must have been 400.",
		run: checkStrictKeys,
	},
	{
		ID:     "overlong-key",
		Title:  "a key over the maximum length is refused with 400",
		Source: "draft §5; Stripe",
		Explain: "Sends a key one byte longer than -max-key (255 by default, Stripe's and idem's limit): it " +
			"must be 400, not truncated nor taken.",
		run: checkOverlong,
	},
	{
		ID:     "stored-4xx",
		Title:  "a 4xx answer is stored and replayed",
		Source: "draft §2.6; Stripe",
		Explain: "Sends the -d4xx body (one the API refuses with a 4xx other than 401, 403, 407, 408, 409, 425 and " +
			"429, and without Retry-After) with a " +
			"fresh key twice: the retry must replay the refusal byte for byte, marked as a replay (unmarked, " +
			"it cannot be told from the request running again). Give a body the API refuses while running (an " +
			"unknown product, a declined card), not in validation of the request's shape: an API may keep " +
			"nothing of a request it refused before running it, as Stripe does. Not applicable without -d4xx.",
		run: checkStored4xx,
	},
	{
		ID:      "released-5xx",
		Profile: "retry-safe",
		Title:   "a 5xx is not kept: the retry runs again",
		Source:  "idem; AWS Powertools; draft §2.6",
		Explain: "Sends the -d5xx body (one the API answers with a 5xx: a provider that fails, say) with a fresh " +
			"key twice, then the accepted body under the same key: the record of the failure must have been " +
			"let go, so the accepted body executes (2xx). A 422 or the 5xx again means the failure is kept for " +
			"the record's lifetime, and a client that retries as told never gets through. The draft lets an API " +
			"replay an error (§2.6), and Stripe keeps its 500s: a profile, not the core. Not applicable " +
			"without -d5xx.",
		run: checkReleased5xx,
	},
	{
		ID:     "scoped-keys",
		Title:  "one caller's key never replays another caller's answer",
		Source: "draft §2.2, §6; Stripe",
		Explain: "With -H2 (the headers of a second caller), sends a fresh key as the first caller, then the same " +
			"key and body as the second: the second must not get the first's answer (replayed, or the same bytes " +
			"where answers carry ids, or an effect that did not move for the second caller); it executes on its " +
			"own, and each caller's retry replays its own answer. A 4xx to the second caller (409, 422, a 403 " +
			"that says the key is another's) is a warning (the key space is shared: nothing leaks, but one " +
			"caller can block another's key). The second " +
			"caller is checked first with a key of its own. Not applicable without -H2.",
		run: checkScoped,
	},
	{
		ID:     "get-untouched",
		Title:  "a GET carrying a key is not intercepted",
		Source: "draft §1; Stripe",
		Explain: "Sends GET to the URL twice with a fresh key, then with the concurrent check's key to the URL " +
			"and, with a fresh key and with that key, elsewhere (the -effect-url, or / on the URL's host): GET is " +
			"idempotent and keys do not apply to it, so no answer may be a replay, a 409, a 422, or the concurrent " +
			"request's answer where a fresh key got another (whatever else a URL answers to GET, 405 included, " +
			"passes). Last, the first GET's key elsewhere must not get the URL's answer to it.",
		run: checkGet,
	},
	{
		ID:     "private-headers",
		Title:  "a replay never carries the first answer's Set-Cookie",
		Source: "RFC 6265 §8; RFC 9111 §3.1",
		Explain: "Judges every replay of the run (it sends nothing): a Set-Cookie (or Authentication-Info) that " +
			"an execution's answer set, and that not every execution sets alike, belongs to that answer's " +
			"caller: a replay that carries it hands one caller's session to whoever retries. Not applicable when " +
			"no answer set one.",
		run: checkPrivateHeaders,
	},
	{
		ID:      "problem-bodies",
		Profile: "problem-details",
		Title:   "refusals of the key are problem details (RFC 9457)",
		Source:  "draft §2.7; RFC 9457",
		Explain: "Judges the 400s, 409s and 422s that refused a key in the other checks (it sends nothing): each " +
			"must be application/problem+json, a JSON object whose status (when present) is the answer's and " +
			"whose type, title and detail (when present) are strings. The draft's examples are problem details " +
			"and it asks for a link to the documentation, which type is. Not applicable when no key was refused.",
		run: checkProblemDetails,
	},
	{
		ID:     "expiry",
		Title:  "a key executes again after the retention",
		Source: "draft §2.3",
		Explain: "With -retention (how long the API documents that it keeps a key), sends a fresh key after the " +
			"first check, again shortly before the retention ends (a second and twice the first request's time " +
			"before, or a hundredth of the retention if more, at most a fifth: it must still replay, as a record " +
			"that expires early lets a late retry execute twice), and after the retention and a second (it must execute " +
			"again: the key is free, and its record gone; still replayed some time after, a warning: records " +
			"outlive the retention given, which loses no effect). The run lasts at least the retention. Not " +
			"applicable without -retention.",
		run:   checkExpiry,
		start: startExpiry,
	},
	effectInfo,
}

var effectInfo = Info{
	ID:     "effect",
	Title:  "the effect moved exactly once per execution",
	Source: "payment teams' practice",
	Explain: "With -effect-url and -effect-json-path, reads the count before the first check and after each " +
		"one, and once more a second after the last (an execution that lands after its answer, a duplicate " +
		"run on another node, is counted): over the run, and in every check, it must move by exactly the number of executions the answers " +
		"show (a 2xx answer is one unless it repeats an earlier answer under its key or is marked a replay). " +
		"A check whose answers look right but whose effect moved otherwise fails too. The second caller's " +
		"executions may move it or not (a count of every caller's effects, or of the first caller's). Not " +
		"applicable without them.",
}

func checkRetryReplay(ctx context.Context, c *check) (Status, string, error) {
	key := c.p.newKey()
	first := c.settle(ctx, c.keyed(key))
	if !first.ok() {
		e := &NotAcceptedError{Status: first.status, Body: excerpt(first.body), Err: first.err}
		if first.err == nil && first.status >= 300 && first.status <= 399 {
			e.Location = printable(first.header.Get("Location"))
			if u, err := url.Parse(first.header.Get("Location")); err == nil {
				if base, err := url.Parse(c.p.cfg.URL); err == nil {
					e.Location = printable(base.ResolveReference(u).String())
				}
			}
		}
		return "", "", e
	}
	for i := 1; i <= 2; i++ {
		a := c.settle(ctx, c.keyed(key))
		if !first.same(a) {
			return Fail, fmt.Sprintf("retry %d got %s; the first answer was %s", i, a, first), nil
		}
		c.p.replays = append(c.p.replays, a)
	}
	return Pass, fmt.Sprintf("2 retries got the first answer (%s) byte for byte, %s",
		statusText(first.status), markerText(c.p.replays[len(c.p.replays)-1])), nil
}

// markerText says how a replay was marked, for a reason.
func markerText(a *answer) string {
	if name, value := a.marker(); name != "" {
		return "marked " + name + ": " + printable(value)
	}
	return "with no marker header"
}

func checkReplayMarker(ctx context.Context, c *check) (Status, string, error) {
	if len(c.p.replays) == 0 {
		return NotApplicable, "no answer was a replay", nil
	}
	for _, a := range c.p.replays {
		if !a.stripeMarked() {
			return Fail, fmt.Sprintf("a replay (%s) came %s, not %s: true", statusText(a.status), markerText(a), ReplayedHeader), nil
		}
	}
	return Pass, fmt.Sprintf("%d replays marked %s: true", len(c.p.replays), ReplayedHeader), nil
}

func checkConcurrent(ctx context.Context, c *check) (Status, string, error) {
	n := c.p.cfg.Concurrency
	key := c.p.newKey()
	c.p.concurrentKey = key
	answers := c.sendAtOnce(ctx, n, func(int) request { return c.keyed(key) })
	defer func() { c.p.concurrent = answers }()

	var conflicts, marked, unmarked int
	var executions []*answer // distinct unmarked 2xx answers
	var bad []string
	for i, a := range answers {
		switch {
		case a.err != nil:
			bad = append(bad, fmt.Sprintf("request %d: %s", i+1, a))
		case a.status == http.StatusConflict:
			conflicts++
			c.p.noteInFlight("a duplicate sent while the first ran", a)
		case a.replayed():
			marked++
		case a.ok():
			known := false
			for _, e := range executions {
				if e.same(a) {
					known = true
					unmarked++
					break
				}
			}
			if !known {
				executions = append(executions, a)
			}
		default:
			bad = append(bad, fmt.Sprintf("request %d got %s", i+1, a))
		}
	}
	if len(bad) > 0 {
		return Fail, fmt.Sprintf("%d of %d requests got neither a 2xx nor 409: %s", len(bad), n, strings.Join(first3(bad), "; ")), nil
	}
	switch len(executions) {
	case 0:
		return Fail, fmt.Sprintf("no request executed: %d got 409 and %d were marked replays of an execution none of them saw", conflicts, marked), nil
	case 1:
	default:
		return Fail, fmt.Sprintf("%d of %d requests with one key executed (2xx answers, not marked as replays, with different bodies)", len(executions), n), nil
	}
	for i, a := range answers {
		if a.replayed() && !a.same(executions[0]) {
			return Fail, fmt.Sprintf("request %d was marked a replay but got %s; the execution's answer was %s", i+1, a, executions[0]), nil
		}
	}
	c.p.execTime = executions[0].took
	how := fmt.Sprintf("%d marked", marked)
	if unmarked > 0 {
		how += fmt.Sprintf(", %d unmarked with its bytes", unmarked)
	}
	reason := fmt.Sprintf("%d requests with one key: 1 executed (%s, in %v), %d replayed (%s), %d got 409",
		n, statusText(executions[0].status), roundTook(executions[0].took), marked+unmarked, how, conflicts)
	if conflicts > 0 {
		reason += " (" + retryAfterText(answers) + ")"
	}
	return Pass, reason, nil
}

// noteInFlight keeps a 409 to a request sent while the key's first ran,
// for retry-after and problem-details.
func (p *prober) noteInFlight(what string, a *answer) {
	p.mu.Lock()
	p.inFlight = append(p.inFlight, a)
	p.mu.Unlock()
	p.noteRefusal(what, a)
}

// roundTook rounds a request's time for a reason.
func roundTook(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// retryAfterText says what Retry-After the 409s among answers carried.
func retryAfterText(answers []*answer) string {
	values := map[string]int{}
	var order []string
	for _, a := range answers {
		if a.err != nil || a.status != http.StatusConflict {
			continue
		}
		v := printable(a.header.Get("Retry-After"))
		if v == "" {
			v = "none"
		}
		if values[v] == 0 {
			order = append(order, v)
		}
		values[v]++
	}
	parts := make([]string, 0, len(order))
	for _, v := range order {
		parts = append(parts, fmt.Sprintf("%d with %s", values[v], v))
	}
	return "Retry-After: " + strings.Join(parts, ", ")
}

func checkConcurrent409(ctx context.Context, c *check) (Status, string, error) {
	if len(c.p.concurrent) == 0 {
		return NotApplicable, "the concurrent check sent nothing", nil
	}
	conflicts := 0
	for _, a := range c.p.concurrent {
		if a.err == nil && a.status == http.StatusConflict {
			conflicts++
		}
	}
	if conflicts == 0 {
		return Warning, fmt.Sprintf("none of %d duplicates got 409: the API waits and replays, or the first ended before the others came", len(c.p.concurrent)-1), nil
	}
	return Pass, fmt.Sprintf("%d of %d duplicates got 409", conflicts, len(c.p.concurrent)-1), nil
}

// checkMismatch sends another body with a fresh key (the first of
// otherBodies the API accepts on its own), then the body under that key:
// it must be refused with 422. The other body goes first so that a 422
// cannot be the API's refusal of a body it would refuse under any key.
func checkMismatch(ctx context.Context, c *check) (Status, string, error) {
	p := c.p
	st := &mismatchState{}
	p.mismatch = st
	for _, other := range otherBodies(p.cfg.Body, p.cfg.Header.Get("Content-Type"), p.runID) {
		key := p.newKey()
		rq := c.keyed(key)
		rq.body = other
		a := c.settle(ctx, rq)
		if a.ok() {
			st.key, st.body, st.first = key, other, a
			break
		}
		st.refused = append(st.refused, a)
	}
	if st.first == nil {
		var got []string
		for _, a := range st.refused {
			got = append(got, a.String())
		}
		return NotApplicable, fmt.Sprintf("each other body the probe makes (a number or a string changed, a member added) was refused under a fresh key (%s): "+
			"a refusal of the key cannot be told from a refusal of the body", strings.Join(first3(got), "; ")), nil
	}
	a := c.settle(ctx, c.keyed(st.key))
	switch {
	case a.err == nil && a.status == http.StatusUnprocessableEntity:
		p.noteRefusal("the key with another body", a)
		st.got422 = true
		return Pass, "the key, used by another body the API accepts (" + statusText(st.first.status) + "), got 422 with the body", nil
	case a.replayed() || st.first.same(a):
		return Fail, "the key with another body got the first answer replayed (" + statusText(a.status) + "): the API does not compare the request with the key's first", nil
	default:
		return Fail, "the key with another body got " + a.String() + "; the draft says 422", nil
	}
}

func checkAfterMismatch(ctx context.Context, c *check) (Status, string, error) {
	st := c.p.mismatch
	if st == nil || !st.got422 {
		return NotApplicable, "the mismatch check got no 422", nil
	}
	rq := c.keyed(st.key)
	rq.body = st.body
	a := c.settle(ctx, rq)
	if !st.first.same(a) {
		return Fail, "the key's first request, sent again after the 422, got " + a.String() + "; its first answer was " + st.first.String() + ": the refused request poisoned the key", nil
	}
	return Pass, "the key's first request, sent again after the 422, got its first answer (" + statusText(a.status) + ") again", nil
}

func checkReordered(ctx context.Context, c *check) (Status, string, error) {
	other, ok := reordered(c.p.cfg.Body)
	if !ok {
		return NotApplicable, "the body is not a JSON object of two members or more whose names differ (but for case)", nil
	}
	key := c.p.newKey()
	first := c.settle(ctx, c.keyed(key))
	if !first.ok() {
		return Fail, "the first request with a fresh key got " + first.String(), nil
	}
	rq := c.keyed(key)
	rq.body = other
	a := c.settle(ctx, rq)
	switch {
	case first.same(a):
		return Pass, "the body with its members reversed got the first answer (" + statusText(a.status) + ") again", nil
	case a.err == nil && a.status == http.StatusUnprocessableEntity:
		return Fail, "the body with its members reversed got 422: the API compares bytes, not the JSON they encode", nil
	default:
		return Fail, "the body with its members reversed got " + a.String() + "; the first answer was " + first.String(), nil
	}
}

func checkTwoKeys(ctx context.Context, c *check) (Status, string, error) {
	a := c.settle(ctx, c.keyed(c.p.newKey()))
	b := c.settle(ctx, c.keyed(c.p.newKey()))
	for i, x := range []*answer{a, b} {
		if !x.ok() {
			return Fail, fmt.Sprintf("key %d got %s", i+1, x), nil
		}
	}
	if b.replayed() {
		return Fail, "the second key's answer is marked as a replay: the API matches requests by their body, not by the key", nil
	}
	if a.same(b) {
		return Pass, "both keys got 2xx, neither marked as a replay (their answers are byte-identical: only the effect tells two executions from one)", nil
	}
	return Pass, "both keys executed: 2xx, different answers, neither marked as a replay", nil
}

func checkHeaderCase(ctx context.Context, c *check) (Status, string, error) {
	name := c.p.cfg.KeyHeader
	lower, upper := strings.ToLower(name), strings.ToUpper(name)
	key := c.p.newKey()
	rq := c.keyed(key)
	rq.keyName = lower
	first := c.settle(ctx, rq)
	if !first.ok() {
		return Fail, fmt.Sprintf("the key under %q got %s", lower, first), nil
	}
	rq.keyName = upper
	a := c.settle(ctx, rq)
	if !first.same(a) {
		return Fail, fmt.Sprintf("the key sent under %q, then under %q, got %s, then %s: the second spelling was not read as the same header", lower, upper, first, a), nil
	}
	return Pass, fmt.Sprintf("the key under %q executed, under %q it replayed", lower, upper), nil
}

func checkQuoted(ctx context.Context, c *check) (Status, string, error) {
	key := c.p.newKey()
	rq := c.keyed(key)
	rq.keyValue = `"` + key + `"`
	first := c.settle(ctx, rq)
	switch {
	case first.err == nil && first.status == http.StatusBadRequest:
		return Fail, "the quoted key was refused: " + first.String() + "; the draft's syntax is an RFC 8941 string", nil
	case !first.ok():
		return Fail, "the quoted key, fresh, got " + first.String(), nil
	}
	a := c.settle(ctx, rq)
	if !first.same(a) {
		return Fail, "the quoted key sent again got " + a.String() + "; its first answer was " + first.String() + ": the quoted key names no record", nil
	}
	c.p.quoted = &quotedState{key: key, first: first}
	return Pass, "the quoted key executed (" + statusText(first.status) + "), sent again it replayed", nil
}

func checkBare(ctx context.Context, c *check) (Status, string, error) {
	st := c.p.quoted
	if st == nil {
		return NotApplicable, "quoted-key did not pass", nil
	}
	a := c.settle(ctx, c.keyed(st.key))
	switch {
	case st.first.same(a):
		return Pass, "the bare key got the quoted key's answer (" + statusText(a.status) + "): one key", nil
	case a.ok():
		return Fail, "the bare key got " + a.String() + "; the quoted key got " + st.first.String() + ": the API takes the quotes as part of the key (the draft allows it)", nil
	default:
		return Fail, "the bare key got " + a.String() + ": the API takes only the draft's quoted form", nil
	}
}

func checkMissing(ctx context.Context, c *check) (Status, string, error) {
	a := c.send(ctx, request{body: c.p.cfg.Body})
	switch {
	case a.err == nil && a.status == http.StatusBadRequest:
		c.p.noteRefusal("a request without a key", a)
		return Pass, "a request without " + c.p.cfg.KeyHeader + " got 400", nil
	case a.ok() && c.p.cfg.KeyRequired:
		return Fail, "a request without " + c.p.cfg.KeyHeader + " got " + statusText(a.status) + " and ran unguarded, where the key is required (-require-key): a client that forgets it gets no protection", nil
	case a.ok():
		return NotApplicable, "a request without " + c.p.cfg.KeyHeader + " got " + statusText(a.status) + ": the API runs keyless requests unguarded (a client that forgets the key gets no protection)", nil
	default:
		return Fail, "a request without " + c.p.cfg.KeyHeader + " got " + a.String() + "; the draft says 400", nil
	}
}

// malformedKeys are the malformed keys: what they are, and their value.
// The first is never an sf-string: it must be refused; the others are
// refused only by a strict validation.
var malformedKeys = []struct{ what, value string }{
	{"a key with a tab inside", "probe-\tkey"},
	{"an empty key", ""},
	{"a key that is not UTF-8", "probe-\xff\xfe-not-utf8"},
}

func checkMalformed(ctx context.Context, c *check) (Status, string, error) {
	var bad, lenient []string
	for i, m := range malformedKeys {
		value := m.value
		if value != "" {
			value += "-" + randomHex(8)
		}
		a := c.send(ctx, request{body: c.p.cfg.Body, keyName: c.p.cfg.KeyHeader, keyValue: value, key: value})
		if a.err == nil && a.status == http.StatusBadRequest {
			c.p.noteRefusal(m.what, a)
			continue
		}
		switch {
		case i == 0:
			bad = append(bad, m.what+" got "+a.String())
		case a.err == nil && a.status >= 500:
			lenient = append(lenient, m.what+" got "+a.String()+" (a server error, not a refusal)")
		default:
			lenient = append(lenient, m.what+" got "+a.String())
		}
	}
	c.p.lenient = lenient
	if len(bad) > 0 {
		return Fail, strings.Join(append(bad, lenient...), "; "), nil
	}
	if len(lenient) > 0 {
		return Warning, "a key with a tab got 400, but " + strings.Join(lenient, "; ") + ": a lenient validation", nil
	}
	return Pass, fmt.Sprintf("%d malformed keys (a tab inside, empty, not UTF-8) each got 400", len(malformedKeys)), nil
}

func checkStrictKeys(ctx context.Context, c *check) (Status, string, error) {
	if len(c.p.lenient) > 0 {
		return Fail, strings.Join(c.p.lenient, "; "), nil
	}
	return Pass, "the empty and the non-UTF-8 key each got 400", nil
}

func checkOverlong(ctx context.Context, c *check) (Status, string, error) {
	n := c.p.cfg.MaxKeyLen + 1
	key := c.p.newKey()
	for len(key) < n {
		key += randomHex(16)
	}
	key = key[:n]
	a := c.send(ctx, c.keyed(key))
	if a.err == nil && a.status == http.StatusBadRequest {
		c.p.noteRefusal("an overlong key", a)
		return Pass, fmt.Sprintf("a key of %d bytes got 400", n), nil
	}
	return Fail, fmt.Sprintf("a key of %d bytes (over the %d that -max-key says) got %s", n, n-1, a), nil
}

func checkStored4xx(ctx context.Context, c *check) (Status, string, error) {
	if c.p.cfg.RefusedBody == nil {
		return NotApplicable, "give -d4xx with a body the API refuses with a 4xx (an unknown product, say) to check that refusals are stored", nil
	}
	key := c.p.newKey()
	rq := c.keyed(key)
	rq.body = c.p.cfg.RefusedBody
	first := c.settle(ctx, rq)
	if first.err != nil || first.status < 400 || first.status > 499 {
		return Fail, "the -d4xx body got " + first.String() + "; give -d4xx a body the API refuses with a 4xx", nil
	}
	switch first.status {
	case http.StatusConflict, http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired:
		return Fail, "the -d4xx body got " + statusText(first.status) + ", an answer a retry is meant to run again; give -d4xx a body the API refuses for good (400, 404, 422)", nil
	}
	if len(first.header.Values("Retry-After")) > 0 {
		return Fail, "the -d4xx body got " + statusText(first.status) + " with Retry-After, an answer that says to try again; give -d4xx a body the API refuses for good (400, 404, 422)", nil
	}
	a := c.settle(ctx, rq)
	switch {
	case !first.same(a):
		return Fail, "the retry got " + a.String() + "; the first answer was " + first.String(), nil
	case !a.replayed() && c.p.marksReplays():
		return Fail, "the retry got the same " + statusText(a.status) + " unmarked where the API marks its replays: the refusal was not stored (the request ran again). " +
			"An API that refuses a request in validation, before it runs, may keep nothing (Stripe does): give -d4xx a body it refuses while running (an unknown product, a declined card)", nil
	case !a.replayed():
		c.p.replays = append(c.p.replays, a)
		return Warning, "the retry got the same " + statusText(a.status) + ", unmarked (as every replay of the API): a stored refusal cannot be told from the request refused again", nil
	}
	c.p.replays = append(c.p.replays, a)
	return Pass, "the retry got the stored " + statusText(a.status) + " byte for byte, " + markerText(a), nil
}

// marksReplays reports whether an answer judged a replay so far carried a
// marker.
func (p *prober) marksReplays() bool {
	for _, a := range p.replays {
		if a.replayed() {
			return true
		}
	}
	return false
}

func checkGet(ctx context.Context, c *check) (Status, string, error) {
	key := c.p.newKey()
	get := request{method: http.MethodGet, keyName: c.p.cfg.KeyHeader, keyValue: key, key: key, get: true}
	type sent struct {
		what string
		a    *answer
		// like, when not nil, is an answer a record of the key would
		// serve (the POST's, another path's GET's), and whose the
		// answer; fresh is the answer of a GET to the same URL with a
		// fresh key. The answer must not be like where fresh is not.
		like   *answer
		whose  string
		fresh  *answer
		reason string
	}
	answers := []sent{{what: "GET with a fresh key", a: c.send(ctx, get)}, {what: "GET with that key again", a: c.send(ctx, get)}}
	if k := c.p.concurrentKey; k != "" {
		var post *answer // the concurrent check's execution
		c.p.mu.Lock()
		if e := c.p.seen[k]; len(e) > 0 {
			post = e[0]
		}
		c.p.mu.Unlock()
		byPost := "GET requests are served from the key's record"
		onURL := get
		onURL.keyValue, onURL.key = k, k
		answers = append(answers, sent{"GET with the key of the concurrent check's " + c.p.cfg.Method, c.send(ctx, onURL),
			post, "the " + c.p.cfg.Method + "'s answer", answers[0].a, byPost})
		other := get
		other.url = c.p.elsewhere()
		other.keyValue = c.p.newKey()
		other.key = other.keyValue
		fresh := c.send(ctx, other)
		answers = append(answers, sent{what: "GET " + other.url + " with a fresh key", a: fresh})
		other.keyValue, other.key = k, k
		answers = append(answers, sent{"GET " + other.url + " with the " + c.p.cfg.Method + "'s key", c.send(ctx, other),
			post, "the " + c.p.cfg.Method + "'s answer", fresh, byPost})
		// The first GET's key elsewhere: a record of the key alone (no
		// path in it) serves it the first GET's answer.
		other.keyValue, other.key = key, key
		answers = append(answers, sent{"GET " + other.url + " with the key of the first GET to the URL", c.send(ctx, other),
			answers[0].a, "the URL's answer to that GET", fresh, "GET requests are served from a record of the key, whatever their path"})
	}
	// sameAnswer reports whether a and b have one status and body.
	sameAnswer := func(a, b *answer) bool {
		return a.err == nil && b.err == nil && a.status == b.status && a.sameBody(b)
	}
	for _, s := range answers {
		a := s.a
		switch {
		case a.err != nil:
			return Fail, s.what + " got " + a.String(), nil
		case a.replayed():
			return Fail, s.what + " got a replay (" + statusText(a.status) + "): GET requests are intercepted", nil
		case a.status == http.StatusConflict || a.status == http.StatusUnprocessableEntity:
			return Fail, s.what + " got " + a.String() + ": GET requests are intercepted", nil
		case s.like != nil && s.like.size > 0 && sameAnswer(a, s.like) && !sameAnswer(a, s.fresh):
			// The answer a record of the key would serve, where the same
			// GET with a fresh key got another: the key chose it.
			return Fail, s.what + " got " + s.whose + " (" + s.like.String() + "), where a fresh key got " + s.fresh.String() + ": " + s.reason, nil
		}
	}
	return Pass, fmt.Sprintf("GET with a key got %s, never a replay, 409, 422 or a %s's answer, on the URL and elsewhere", statusText(answers[0].a.status), c.p.cfg.Method), nil
}

// elsewhere returns a URL other than the probed one for a GET: the
// effect's URL, or / on the probed URL's host.
func (p *prober) elsewhere() string {
	if p.cfg.EffectURL != "" {
		return p.cfg.EffectURL
	}
	u, _ := url.Parse(p.cfg.URL) // parsed by normalize
	u.Path, u.RawPath, u.RawQuery, u.Fragment = "/", "", "", ""
	return u.String()
}

func first3(s []string) []string {
	if len(s) > 3 {
		return append(s[:3:3], fmt.Sprintf("and %d more", len(s)-3))
	}
	return s
}
