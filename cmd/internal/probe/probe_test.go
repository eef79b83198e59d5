package probe_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/probe"
)

const (
	fakeBody    = `{"item":"book","qty":1}`
	fakeRefused = `{"item":"refuse","qty":1}`
	fakeFailed  = `{"item":"fail","qty":1}`
)

// fakeConfig probes the fake API at base with every check applicable but
// expiry: its effect, a refused and a failing body, a second caller, keys
// required.
func fakeConfig(base string) *probe.Config {
	return &probe.Config{
		URL:             base + "/api",
		Header:          http.Header{"X-User": {"probe"}},
		OtherHeader:     http.Header{"X-User": {"other"}},
		Body:            []byte(fakeBody),
		RefusedBody:     []byte(fakeRefused),
		ServerErrorBody: []byte(fakeFailed),
		KeyRequired:     true,
		EffectURL:       base + "/count",
		EffectPath:      "count",
		// The fake's effects land with their answers: no read after a
		// quiet while (TestLateEffect has one).
		EffectSettle: -1,
	}
}

// statuses returns the IDs of the checks with status s.
func statuses(rep *probe.Report, s probe.Status) []string {
	var ids []string
	for _, r := range rep.Checks {
		if r.Status == s {
			ids = append(ids, r.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

func run(t *testing.T, cfg *probe.Config) *probe.Report {
	t.Helper()
	rep, err := probe.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(rep.Checks) != len(probe.Checks) {
		t.Fatalf("%d results, want one per check (%d)", len(rep.Checks), len(probe.Checks))
	}
	for i, r := range rep.Checks {
		if r.ID != probe.Checks[i].ID || r.Reason == "" || r.Source == "" || r.Title == "" {
			t.Errorf("result %d: %+v; want check %s with a title, a reason and a source", i, r, probe.Checks[i].ID)
		}
		if r.Grade != probe.Checks[i].Grade() || r.Profile != probe.Checks[i].Profile {
			t.Errorf("result %s: grade %q, profile %q; want %q, %q", r.ID, r.Grade, r.Profile, probe.Checks[i].Grade(), probe.Checks[i].Profile)
		}
	}
	return rep
}

func logReport(t *testing.T, rep *probe.Report) {
	t.Helper()
	for _, r := range rep.Checks {
		t.Logf("%-21s %-7s %s", r.ID, r.Status, r.Reason)
	}
}

// scheduled are the checks whose outcome depends on whether a duplicate
// arrived while the first request ran: the test judges them by what the
// fake did (its 409s, its replays to another body).
var scheduled = []string{"concurrent-409", "retry-after"}

// TestBrokenAPIs probes APIs that each break one behaviour, and APIs
// that implement an alternative the draft allows: the checks that fail,
// warn and do not apply are exactly the ones that behaviour makes so, and
// the core grade (CoreOK) is the fixture's ground truth: an alternative
// fails at most a profile, a defect fails the core.
func TestBrokenAPIs(t *testing.T) {
	t.Parallel()
	const delay = 30 * time.Millisecond // duplicates come while the first runs
	for _, c := range []struct {
		name               string
		k                  knobs
		coreOK             bool
		failed, na, warned []string
		// maybe are checks that may pass or fail as scheduling goes.
		maybe []string
	}{
		{name: "correct", k: knobs{execDelay: delay}, coreOK: true},
		// Alternatives the draft allows: core passes.
		{name: "marker X-Idempotent-Replayed", k: knobs{markerName: "X-Idempotent-Replayed"}, coreOK: true, failed: []string{"replay-marker"}},
		{name: "replays unmarked", k: knobs{noReplayHeader: true}, coreOK: true, failed: []string{"replay-marker"}, warned: []string{"stored-4xx"}},
		{name: "raw fingerprint", k: knobs{rawFingerprint: true}, coreOK: true, failed: []string{"reordered-json"}},
		{name: "bare key distinct from quoted", k: knobs{quotedLiteral: true}, coreOK: true, failed: []string{"bare-key"}},
		{name: "lenient keys", k: knobs{lenientKeys: true}, coreOK: true, failed: []string{"strict-key-validation"}, warned: []string{"malformed-key"}},
		{name: "wait and replay", k: knobs{waitReplay: true, execDelay: delay}, coreOK: true},
		{name: "5xx kept, as Stripe does", k: knobs{keep5xx: true}, coreOK: true, failed: []string{"released-5xx"}},
		{name: "409 without Retry-After", k: knobs{no409After: true, execDelay: delay}, coreOK: true},
		{name: "refusals not problem details", k: knobs{plainErrors: true}, coreOK: true, failed: []string{"problem-bodies"}},
		{name: "keys shared, refused to others", k: knobs{globalKeys: true, fpCaller: true, rawFingerprint: true}, coreOK: true,
			failed: []string{"reordered-json"}, warned: []string{"scoped-keys"}},
		{name: "keys shared, refused to others with 403", k: knobs{globalKeys: true, foreignKey: http.StatusForbidden}, coreOK: true,
			warned: []string{"scoped-keys"}},
		// A validation ahead of the idempotency layer refuses the probe's
		// other body whatever its key: a refusal of the body, not of the
		// key, and no defect.
		{name: "unknown members refused with 400", k: knobs{strictMembers: 400}, coreOK: true},
		{name: "unknown members refused with 422", k: knobs{strictMembers: 422}, coreOK: true},
		// The fingerprint of the parsed request: a member it does not
		// know is no other request.
		{name: "fingerprint of the known members", k: knobs{fpKnown: true}, coreOK: true},
		// Defects: core fails.
		{name: "no idempotency", k: knobs{noIdempotency: true}, coreOK: false,
			failed: []string{"concurrent", "concurrent-mismatch", "header-case", "malformed-key", "mismatch-422", "missing-key", "overlong-key",
				"quoted-key", "reordered-json", "retry-replay", "scoped-keys", "strict-key-validation"},
			na:     []string{"after-mismatch", "bare-key", "problem-bodies", "replay-marker"},
			warned: []string{"stored-4xx"}},
		{name: "ignores the body", k: knobs{ignoreBody: true}, coreOK: false, failed: []string{"mismatch-422"}, na: []string{"after-mismatch"},
			maybe: []string{"concurrent-mismatch"}},
		// Its 422 to the other body is the validation's, not the key's:
		// an accepted other body gets the first answer.
		{name: "ignores the body, refuses unknown members with 422", k: knobs{ignoreBody: true, strictMembers: 422}, coreOK: false,
			failed: []string{"mismatch-422"}, na: []string{"after-mismatch"}, maybe: []string{"concurrent-mismatch"}},
		{name: "in flight, waits and replays any body", k: knobs{waitNoCompare: true, execDelay: delay}, coreOK: false},
		{name: "poisoned after 422", k: knobs{poisonAfter422: true}, coreOK: false, failed: []string{"after-mismatch"}},
		{name: "500 without a key", k: knobs{missing500: true}, coreOK: false, failed: []string{"missing-key"}},
		{name: "keyless requests run though keys are required", k: knobs{keyOptional: true}, coreOK: false, failed: []string{"missing-key"}},
		{name: "accepts overlong keys", k: knobs{acceptOverlong: true}, coreOK: false, failed: []string{"overlong-key"}},
		{name: "intercepts GET", k: knobs{interceptGET: true}, coreOK: false, failed: []string{"get-untouched"}},
		{name: "GET served from a POST's record", k: knobs{getFromRecord: true}, coreOK: false, failed: []string{"get-untouched"}},
		{name: "case-sensitive header", k: knobs{caseSensitive: true}, coreOK: false, failed: []string{"header-case"}},
		{name: "quoted key refused", k: knobs{quotedRefused: true}, coreOK: false, failed: []string{"quoted-key"}, na: []string{"bare-key"}},
		{name: "quoted key ignored", k: knobs{quotedIgnored: true}, coreOK: false, failed: []string{"quoted-key"}, na: []string{"bare-key"}},
		{name: "4xx not stored", k: knobs{no4xxStore: true}, coreOK: false, failed: []string{"stored-4xx"}},
		{name: "check then act", k: knobs{races: true}, coreOK: false, failed: []string{"concurrent", "concurrent-mismatch"}},
		{name: "executes retries, answers replays", k: knobs{reexecutes: true}, coreOK: false,
			failed: []string{"after-mismatch", "bare-key", "concurrent", "concurrent-mismatch", "effect", "header-case", "quoted-key", "reordered-json", "retry-replay", "scoped-keys"}},
		{name: "Set-Cookie replayed", k: knobs{storeCookie: true}, coreOK: false, failed: []string{"private-headers"}},
		{name: "Set-Cookie replayed, folded into one line", k: knobs{foldCookie: true}, coreOK: false, failed: []string{"private-headers"}},
		{name: "keys shared between callers", k: knobs{globalKeys: true}, coreOK: false, failed: []string{"scoped-keys"}},
		{name: "keys shared, replays unmarked", k: knobs{globalKeys: true, noReplayHeader: true}, coreOK: false,
			failed: []string{"replay-marker", "scoped-keys"}, warned: []string{"stored-4xx"}},
		{name: "keys shared, per-caller count, replays unmarked", k: knobs{globalKeys: true, noReplayHeader: true, countPerUser: true}, coreOK: false,
			failed: []string{"replay-marker", "scoped-keys"}, warned: []string{"stored-4xx"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, base := startFake(t, c.k)
			rep := run(t, fakeConfig(base))
			conflicts, cross := f.did()
			// The checks scheduling decides are judged by what the fake did:
			// concurrent-409 by the 409s to the concurrent check's key (one
			// body), retry-after by those of both concurrent checks.
			want := map[string]probe.Status{}
			switch {
			case conflicts == 0:
				want["retry-after"] = probe.NotApplicable
			case c.k.no409After:
				want["retry-after"] = probe.Fail
			default:
				want["retry-after"] = probe.Pass
			}
			want["concurrent-409"] = probe.Pass
			if f.conflictsOneBody() == 0 {
				want["concurrent-409"] = probe.Warning
			}
			if c.k.waitNoCompare {
				// The defect shows only when another body came in flight.
				want["concurrent-mismatch"] = probe.Pass
				if cross > 0 {
					want["concurrent-mismatch"] = probe.Fail
				}
				t.Logf("the fake replayed %d requests of another body", cross)
			}
			if c.k.noIdempotency || c.k.races {
				delete(want, "concurrent-409") // no 409s, or not judged
				want["retry-after"] = probe.NotApplicable
			}
			for _, r := range rep.Checks {
				if w, ok := want[r.ID]; ok && r.Status != w {
					t.Errorf("%s %s (the fake answered %d 409s, %d replays to another body); want %s: %s", r.ID, r.Status, conflicts, cross, w, r.Reason)
				}
			}
			skip := func(id string) bool {
				_, judged := want[id]
				return judged || slices.Contains(scheduled, id) || slices.Contains(c.maybe, id)
			}
			failed := slices.DeleteFunc(statuses(rep, probe.Fail), skip)
			na := slices.DeleteFunc(statuses(rep, probe.NotApplicable), skip)
			warned := slices.DeleteFunc(statuses(rep, probe.Warning), skip)
			wantNA := append([]string{"expiry"}, c.na...)
			slices.Sort(wantNA)
			coreOK := c.coreOK
			if c.k.waitNoCompare {
				coreOK = cross == 0
			}
			// The answers show every execution (each has an id of its
			// own) but where the API hides one behind a replay: in each
			// check the effect moved by the executions the answers show.
			for _, r := range rep.Checks {
				if c.k.reexecutes {
					continue
				}
				if r.EffectDelta == nil {
					t.Errorf("%s: no effect delta", r.ID)
				} else if (*r.EffectDelta != int64(r.Executions) && *r.EffectDelta != int64(r.Executions+r.OtherExecutions)) || strings.Contains(r.Reason, "effect moved") {
					t.Errorf("%s: %d executions (%d of the other caller), effect moved by %d: %s", r.ID, r.Executions, r.OtherExecutions, *r.EffectDelta, r.Reason)
				}
			}
			if !slices.Equal(failed, sorted(c.failed)) || !slices.Equal(na, wantNA) || !slices.Equal(warned, sorted(c.warned)) {
				logReport(t, rep)
				t.Errorf("failed %q, n/a %q, warned %q; want failed %q, n/a %q, warned %q", failed, na, warned, sorted(c.failed), wantNA, sorted(c.warned))
			}
			if rep.CoreOK != coreOK || rep.OK != coreOK {
				logReport(t, rep)
				t.Errorf("core OK %v, OK %v; want %v (no profile required)", rep.CoreOK, rep.OK, coreOK)
			}
			if rep.Passed+rep.Failed+rep.NA+rep.Warnings != len(rep.Checks) || rep.Failed != len(statuses(rep, probe.Fail)) {
				t.Errorf("report %d passed, %d failed, %d n/a, %d warnings; want it to agree with the checks", rep.Passed, rep.Failed, rep.NA, rep.Warnings)
			}
			// The report's effect is the fake's own count.
			if rep.Effect == nil || rep.Effect.Before != 0 || (!c.k.countPerUser && rep.Effect.After != int64(f.executed())) {
				t.Errorf("effect %+v; the fake executed %d", rep.Effect, f.executed())
			}
			sent := 0
			for _, r := range rep.Checks {
				sent += r.Requests
			}
			if sent != rep.Requests || sent == 0 {
				t.Errorf("report counts %d requests, its checks %d", rep.Requests, sent)
			}
		})
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestRequiredProfiles: a profile's failure makes Report.OK false only
// when Config.Profiles requires it; the core grade does not move.
func TestRequiredProfiles(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		k        knobs
		profiles []string
		ok       bool
		failed   map[string][]string
	}{
		{knobs{rawFingerprint: true}, nil, true, map[string][]string{"stripe": {"reordered-json"}}},
		{knobs{rawFingerprint: true}, []string{"strict-keys"}, true, map[string][]string{"stripe": {"reordered-json"}}},
		{knobs{rawFingerprint: true}, []string{"stripe"}, false, map[string][]string{"stripe": {"reordered-json"}}},
		{knobs{lenientKeys: true, quotedLiteral: true}, []string{"strict-keys"}, false,
			map[string][]string{"strict-keys": {"bare-key", "strict-key-validation"}}},
		{knobs{lenientKeys: true}, []string{"stripe"}, true, map[string][]string{"strict-keys": {"strict-key-validation"}}},
		{knobs{keep5xx: true}, []string{"stripe", "strict-keys"}, true, map[string][]string{"retry-safe": {"released-5xx"}}},
		{knobs{keep5xx: true}, []string{"retry-safe"}, false, map[string][]string{"retry-safe": {"released-5xx"}}},
		{knobs{plainErrors: true}, []string{"stripe", "retry-safe"}, true, map[string][]string{"problem-details": {"problem-bodies"}}},
		{knobs{plainErrors: true, keep5xx: true}, []string{"problem-details"}, false,
			map[string][]string{"problem-details": {"problem-bodies"}, "retry-safe": {"released-5xx"}}},
	} {
		_, base := startFake(t, c.k)
		cfg := fakeConfig(base)
		cfg.Profiles = c.profiles
		rep := run(t, cfg)
		if !rep.CoreOK || rep.OK != c.ok || len(rep.Profiles) != len(probe.Profiles) {
			logReport(t, rep)
			t.Errorf("%+v, profiles %q: core OK %v, OK %v; want true, %v", c.k, c.profiles, rep.CoreOK, rep.OK, c.ok)
		}
		for i, pr := range rep.Profiles {
			if pr.Name != probe.Profiles[i] || pr.Required != slices.Contains(c.profiles, pr.Name) ||
				pr.OK != (len(c.failed[pr.Name]) == 0) || !slices.Equal(pr.Failed, c.failed[pr.Name]) {
				t.Errorf("%+v, profiles %q: profile %+v; want failed %q", c.k, c.profiles, pr, c.failed[pr.Name])
			}
		}
	}
}

// TestCorrectAPIExecutions: against the correct fake, every check's
// executions are the effect it moved (the fake counts every caller's
// items: the second caller's executions move it too), and the whole run
// moved the count by the executions the answers show.
func TestCorrectAPIExecutions(t *testing.T) {
	t.Parallel()
	for _, perUser := range []bool{false, true} {
		f, base := startFake(t, knobs{countPerUser: perUser})
		rep := run(t, fakeConfig(base))
		want := map[string]int{"retry-replay": 1, "concurrent": 1, "concurrent-mismatch": 1, "mismatch-422": 1, "reordered-json": 1,
			"two-keys": 2, "header-case": 1, "quoted-key": 1, "released-5xx": 1, "scoped-keys": 1}
		got, other := map[string]int{}, map[string]int{}
		for _, r := range rep.Checks {
			if r.ID == "effect" {
				continue
			}
			d := int64(r.Executions)
			if !perUser {
				d += int64(r.OtherExecutions)
			}
			if r.EffectDelta == nil || *r.EffectDelta != d {
				t.Errorf("per user %v: %s: %d executions, %d of the other caller, effect delta %v", perUser, r.ID, r.Executions, r.OtherExecutions, r.EffectDelta)
			}
			if r.Executions != 0 {
				got[r.ID] = r.Executions
			}
			if r.OtherExecutions != 0 {
				other[r.ID] = r.OtherExecutions
			}
		}
		if !maps.Equal(got, want) || !maps.Equal(other, map[string]int{"scoped-keys": 2}) {
			t.Errorf("per user %v: executions per check %v, of the other caller %v; want %v and scoped-keys 2", perUser, got, other, want)
		}
		total := int64(11)
		if !perUser {
			total += 2
		}
		if f.executed() != 13 || rep.Effect.Expected != total || rep.Effect.After != total {
			t.Errorf("per user %v: the fake executed %d, the report expects %d and read %d; want 13, and %d read", perUser, f.executed(), rep.Effect.Expected, rep.Effect.After, total)
		}
	}
}

// TestExpiry: with Config.Retention, a key replays until its retention
// and executes after it; an API whose records end early fails the check,
// one whose records outlive the retention given is warned of (a longer
// retention loses no effect). The effect agrees with the answers.
func TestExpiry(t *testing.T) {
	t.Parallel()
	const retention = 3 * time.Second
	for _, c := range []struct {
		name       string
		k          knobs
		status     probe.Status
		reason     string
		executions int // of the check: its start, and the key once the record ended
	}{
		{"expires", knobs{retention: retention}, probe.Pass, "executed again", 2},
		{"expires early", knobs{retention: retention, expireEarly: true}, probe.Fail, "ended early", 2},
		{"outlives the retention", knobs{retention: retention, neverExpire: true}, probe.Warning, "outlive the retention given", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, base := startFake(t, c.k)
			cfg := fakeConfig(base)
			cfg.Retention = retention
			start := time.Now()
			rep := run(t, cfg)
			var r probe.Result
			for _, x := range rep.Checks {
				if x.ID == "expiry" {
					r = x
				}
			}
			if r.Status != c.status || !strings.Contains(r.Reason, c.reason) {
				logReport(t, rep)
				t.Fatalf("expiry %s: %s; want %s saying %q", r.Status, r.Reason, c.status, c.reason)
			}
			if rep.CoreOK != (c.status != probe.Fail) {
				t.Errorf("core OK %v", rep.CoreOK)
			}
			if r.Executions != c.executions || *r.EffectDelta != int64(c.executions) {
				t.Errorf("expiry: %d executions, effect %d; want %d", r.Executions, *r.EffectDelta, c.executions)
			}
			if failed := statuses(rep, probe.Fail); rep.Effect.After != int64(f.executed()) || rep.Effect.Expected != rep.Effect.After ||
				c.status == probe.Fail && !slices.Equal(failed, []string{"expiry"}) {
				logReport(t, rep)
				t.Errorf("effect %+v; the fake executed %d; failed %q", rep.Effect, f.executed(), failed)
			}
			// The check waits out the retention unless the record ended
			// early (it stops before the retention's end).
			if took := time.Since(start); took < retention*4/5 || c.status != probe.Fail && took < retention {
				t.Errorf("the run took %v; the retention is %v", took, retention)
			}
		})
	}
}

// TestWithoutEffectOrRefusal: without an effect URL the effect check is
// not applicable, and without a refused body the stored-4xx check; the
// others still pass. A non-JSON body makes reordered-json not applicable
// and the mismatch body a form field.
func TestWithoutEffectOrRefusal(t *testing.T) {
	t.Parallel()
	_, base := startFake(t, knobs{})
	rep := run(t, &probe.Config{URL: base + "/api", Body: []byte("item=book&qty=1")})
	notScheduled := func(id string) bool { return slices.Contains(scheduled, id) }
	if failed, na := statuses(rep, probe.Fail), slices.DeleteFunc(statuses(rep, probe.NotApplicable), notScheduled); len(failed) != 0 ||
		!slices.Equal(na, []string{"effect", "expiry", "released-5xx", "reordered-json", "scoped-keys", "stored-4xx"}) {
		logReport(t, rep)
		t.Errorf("failed %q, n/a %q", failed, na)
	}
	if rep.Effect != nil {
		t.Errorf("effect %+v without an effect URL", rep.Effect)
	}
}

// TestNotAccepted: a first request the API refuses stops the probe with a
// NotAcceptedError naming the answer.
func TestNotAccepted(t *testing.T) {
	t.Parallel()
	f, base := startFake(t, knobs{})
	_, err := probe.Run(context.Background(), &probe.Config{URL: base + "/api", Body: []byte(fakeRefused)})
	var na *probe.NotAcceptedError
	if !errors.As(err, &na) || na.Status != 400 || !strings.Contains(na.Body, "REFUSED") {
		t.Fatalf("Run: %v; want a NotAcceptedError with the 400", err)
	}
	if f.executed() != 0 {
		t.Errorf("the fake executed %d", f.executed())
	}
}

// TestEffectErrors: an effect that cannot be read stops the probe before
// any check runs.
func TestEffectErrors(t *testing.T) {
	t.Parallel()
	f, base := startFake(t, knobs{})
	for _, c := range []struct{ url, path, want string }{
		{base + "/nothing", "count", "404"},
		{base + "/count", "total", `no member "total"`},
		{base + "/count", "count.#", "not an array"},
	} {
		_, err := probe.Run(context.Background(), &probe.Config{URL: base + "/api", Body: []byte(fakeBody), EffectURL: c.url, EffectPath: c.path})
		var ee *probe.EffectError
		if !errors.As(err, &ee) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v; want an EffectError saying %q", c.url, c.path, err, c.want)
		}
	}
	if f.executed() != 0 {
		t.Errorf("the fake executed %d", f.executed())
	}
}

// TestConfigErrors: each unusable Config is a ConfigError naming its field.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg   probe.Config
		field string
	}{
		{probe.Config{}, "URL"},
		{probe.Config{URL: "ftp://x/"}, "URL"},
		{probe.Config{URL: "http://"}, "URL"},
		{probe.Config{URL: "http://x/", Method: "GET"}, "Method"},
		{probe.Config{URL: "http://x/", Method: "PO ST"}, "Method"},
		{probe.Config{URL: "http://x/", KeyHeader: "Bad Name"}, "KeyHeader"},
		{probe.Config{URL: "http://x/", Concurrency: 1}, "Concurrency"},
		{probe.Config{URL: "http://x/", Concurrency: probe.MaxConcurrency + 1}, "Concurrency"},
		{probe.Config{URL: "http://x/", MaxKeyLen: 10}, "MaxKeyLen"},
		{probe.Config{URL: "http://x/", Timeout: -1}, "Timeout"},
		{probe.Config{URL: "http://x/", Header: map[string][]string{"idempotency-key": {"k"}}}, "Header"},
		{probe.Config{URL: "http://x/", EffectURL: "http://x/count"}, "EffectPath"},
		{probe.Config{URL: "http://x/", EffectPath: "count"}, "EffectURL"},
		{probe.Config{URL: "http://x/", EffectURL: "x", EffectPath: "count"}, "EffectURL"},
		{probe.Config{URL: "http://x/", EffectURL: "http://x/", EffectPath: "a..b"}, "EffectPath"},
		{probe.Config{URL: "http://x/", Header: http.Header{"X-User": {"1"}}, OtherHeader: http.Header{"Content-Type": {"text/plain"}}}, "OtherHeader"},
		{probe.Config{URL: "http://x/", OtherHeader: http.Header{}}, "OtherHeader"},
		{probe.Config{URL: "http://x/", Profiles: []string{"stripe", "nope"}}, "Profiles"},
		{probe.Config{URL: "http://x/", Header: http.Header{"X-A": {"b\r\nX-B: c"}}}, "Header"},
		{probe.Config{URL: "http://x/", Header: http.Header{"Bad Name": {"b"}}}, "Header"},
		{probe.Config{URL: "http://x/", Header: http.Header{"X-User": {"1"}}, OtherHeader: http.Header{"X-User": {"2\x00"}}}, "OtherHeader"},
		{probe.Config{URL: "http://x/", EffectURL: "http://x/c", EffectPath: "n", EffectHeader: http.Header{"X-T": {"\x7f"}}}, "EffectHeader"},
	} {
		_, err := probe.Run(context.Background(), &c.cfg)
		var ce *probe.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || ce.Msg == "" {
			t.Errorf("%+v: %v; want a ConfigError on %s", c.cfg, err, c.field)
		}
	}
}

// TestScopedLeakNamesTheCookie: a second caller handed the first
// caller's answer, its session cookie with it (the fake storing Set-Cookie
// in a key space shared by every caller), is told so in scoped-keys'
// reason; the cookie every answer sets alike is not named.
func TestScopedLeakNamesTheCookie(t *testing.T) {
	t.Parallel()
	_, base := startFake(t, knobs{globalKeys: true, storeCookie: true})
	rep := run(t, fakeConfig(base))
	for _, r := range rep.Checks {
		if r.ID == "scoped-keys" && (r.Status != probe.Fail || !strings.Contains(r.Reason, "with the first caller's Set-Cookie sid=…") || strings.Contains(r.Reason, "lang")) {
			t.Errorf("scoped-keys %s: %s", r.Status, r.Reason)
		}
	}
}

// TestAnswerHeadersBounded: an answer whose header block is over the
// probe's bound (1 MiB) is no answer: the probe stops with a
// NotAcceptedError, holding nothing of it.
func TestAnswerHeadersBounded(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range 40 {
			w.Header().Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("x", 64<<10))
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	_, err := probe.Run(context.Background(), &probe.Config{URL: srv.URL, Body: []byte(fakeBody)})
	var na *probe.NotAcceptedError
	if !errors.As(err, &na) || na.Err == nil || !strings.Contains(err.Error(), "header") {
		t.Fatalf("Run: %v; want a NotAcceptedError for the headers' size", err)
	}
}

// TestCallerDefectsWithoutEffect: a replayed Set-Cookie and a GET served
// from a POST's record are found from the answers alone, without
// -effect-url (both passed, with it and without, before those checks).
func TestCallerDefectsWithoutEffect(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		k     knobs
		check string
	}{
		{knobs{storeCookie: true}, "private-headers"},
		{knobs{getFromRecord: true}, "get-untouched"},
		{knobs{globalKeys: true}, "scoped-keys"},
	} {
		_, base := startFake(t, c.k)
		cfg := fakeConfig(base)
		cfg.EffectURL, cfg.EffectPath = "", ""
		rep := run(t, cfg)
		if failed := statuses(rep, probe.Fail); !slices.Equal(failed, []string{c.check}) || rep.CoreOK {
			logReport(t, rep)
			t.Errorf("%+v: failed %q, core OK %v; want %s failed alone", c.k, failed, rep.CoreOK, c.check)
		}
	}
}
