package probe_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/cmd/internal/probe"
)

const (
	fakeBody    = `{"item":"book","qty":1}`
	fakeRefused = `{"item":"refuse","qty":1}`
)

// fakeConfig probes the fake API at base, its effect included.
func fakeConfig(base string) *probe.Config {
	return &probe.Config{
		URL:         base + "/api",
		Body:        []byte(fakeBody),
		RefusedBody: []byte(fakeRefused),
		EffectURL:   base + "/count",
		EffectPath:  "count",
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

// TestBrokenAPIs probes APIs that each break one behaviour, and APIs
// that implement an alternative the draft allows: the checks that fail,
// warn and do not apply are exactly the ones that behaviour makes so, and
// the core grade (CoreOK) is the fixture's ground truth: an alternative
// fails at most a profile, a defect fails the core.
func TestBrokenAPIs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name               string
		k                  knobs
		coreOK             bool
		failed, na, warned []string
	}{
		{"correct", knobs{}, true, nil, nil, []string{"concurrent-409"}},
		// Alternatives the draft allows: core passes.
		{"marker X-Idempotent-Replayed", knobs{markerName: "X-Idempotent-Replayed"}, true,
			[]string{"replay-marker"}, nil, []string{"concurrent-409"}},
		{"replays unmarked", knobs{noReplayHeader: true}, true,
			[]string{"replay-marker"}, nil, []string{"concurrent-409", "stored-4xx"}},
		{"raw fingerprint", knobs{rawFingerprint: true}, true,
			[]string{"reordered-json"}, nil, []string{"concurrent-409"}},
		{"bare key distinct from quoted", knobs{quotedLiteral: true}, true,
			[]string{"bare-key"}, nil, []string{"concurrent-409"}},
		{"lenient keys", knobs{lenientKeys: true}, true,
			[]string{"strict-key-validation"}, nil, []string{"concurrent-409", "malformed-key"}},
		{"wait and replay", knobs{waitReplay: true}, true, nil, nil, []string{"concurrent-409"}},
		// Defects: core fails.
		{"no idempotency", knobs{noIdempotency: true}, false,
			[]string{"concurrent", "header-case", "malformed-key", "mismatch-422", "overlong-key", "quoted-key", "reordered-json", "retry-replay", "strict-key-validation"},
			[]string{"after-mismatch", "bare-key", "missing-key", "replay-marker"}, []string{"concurrent-409", "stored-4xx"}},
		{"ignores the body", knobs{ignoreBody: true}, false, []string{"mismatch-422"}, []string{"after-mismatch"}, []string{"concurrent-409"}},
		{"poisoned after 422", knobs{poisonAfter422: true}, false, []string{"after-mismatch"}, nil, []string{"concurrent-409"}},
		{"500 without a key", knobs{missing500: true}, false, []string{"missing-key"}, nil, []string{"concurrent-409"}},
		{"accepts overlong keys", knobs{acceptOverlong: true}, false, []string{"overlong-key"}, nil, []string{"concurrent-409"}},
		{"intercepts GET", knobs{interceptGET: true}, false, []string{"get-untouched"}, nil, []string{"concurrent-409"}},
		{"case-sensitive header", knobs{caseSensitive: true}, false, []string{"header-case"}, nil, []string{"concurrent-409"}},
		{"quoted key refused", knobs{quotedRefused: true}, false, []string{"quoted-key"}, []string{"bare-key"}, []string{"concurrent-409"}},
		{"quoted key ignored", knobs{quotedIgnored: true}, false, []string{"quoted-key"}, []string{"bare-key"}, []string{"concurrent-409"}},
		{"4xx not stored", knobs{no4xxStore: true}, false, []string{"stored-4xx"}, nil, []string{"concurrent-409"}},
		{"check then act", knobs{races: true}, false, []string{"concurrent"}, nil, []string{"concurrent-409"}},
		{"executes retries, answers replays", knobs{reexecutes: true}, false,
			[]string{"after-mismatch", "bare-key", "concurrent", "effect", "header-case", "quoted-key", "reordered-json", "retry-replay"}, nil, []string{"concurrent-409"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, base := startFake(t, c.k)
			rep := run(t, fakeConfig(base))
			failed, na, warned := statuses(rep, probe.Fail), statuses(rep, probe.NotApplicable), statuses(rep, probe.Warning)
			// Whether a duplicate arrives while the first request runs
			// (409) depends on scheduling: concurrent-409 passes or
			// warns, and only warns against an API that waits.
			for _, r := range rep.Checks {
				if r.ID == "concurrent-409" && r.Status != probe.Warning && (r.Status != probe.Pass || c.k.waitReplay) {
					t.Errorf("concurrent-409 %s: %s", r.Status, r.Reason)
				}
			}
			warned = slices.DeleteFunc(warned, func(id string) bool { return id == "concurrent-409" })
			c.warned = slices.DeleteFunc(c.warned, func(id string) bool { return id == "concurrent-409" })
			// The answers show every execution (each has an id of its
			// own) but where the API hides one behind a replay: in each
			// check the effect moved by the executions the answers show.
			for _, r := range rep.Checks {
				if c.k.reexecutes {
					continue
				}
				if r.EffectDelta == nil {
					t.Errorf("%s: no effect delta", r.ID)
				} else if *r.EffectDelta != int64(r.Executions) || strings.Contains(r.Reason, "effect moved") {
					t.Errorf("%s: %d executions, effect moved by %d: %s", r.ID, r.Executions, *r.EffectDelta, r.Reason)
				}
			}
			if !slices.Equal(failed, c.failed) || !slices.Equal(na, c.na) || !slices.Equal(warned, c.warned) {
				logReport(t, rep)
				t.Errorf("failed %q, n/a %q, warned %q; want failed %q, n/a %q, warned %q", failed, na, warned, c.failed, c.na, c.warned)
			}
			if rep.CoreOK != c.coreOK || rep.OK != c.coreOK {
				logReport(t, rep)
				t.Errorf("core OK %v, OK %v; want %v (no profile required)", rep.CoreOK, rep.OK, c.coreOK)
			}
			if rep.Failed != len(c.failed) || rep.NA != len(c.na) ||
				rep.Passed+rep.Warnings != len(rep.Checks)-len(c.failed)-len(c.na) {
				t.Errorf("report %d passed, %d failed, %d n/a, %d warnings; want it to agree with the checks", rep.Passed, rep.Failed, rep.NA, rep.Warnings)
			}
			// The report's effect is the fake's own count.
			if rep.Effect == nil || rep.Effect.Before != 0 || rep.Effect.After != int64(f.executed()) {
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
// executions are the effect it moved, and the whole run moved the count by
// the number of distinct keys executed.
func TestCorrectAPIExecutions(t *testing.T) {
	t.Parallel()
	f, base := startFake(t, knobs{})
	rep := run(t, fakeConfig(base))
	want := map[string]int{"retry-replay": 1, "concurrent": 1, "mismatch-422": 1, "reordered-json": 1,
		"two-keys": 2, "header-case": 1, "quoted-key": 1}
	got := map[string]int{}
	for _, r := range rep.Checks {
		if r.ID == "effect" {
			continue
		}
		if r.EffectDelta == nil || *r.EffectDelta != int64(r.Executions) {
			t.Errorf("%s: %d executions, effect delta %v", r.ID, r.Executions, r.EffectDelta)
		}
		if r.Executions != 0 {
			got[r.ID] = r.Executions
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("executions per check %v, want %v", got, want)
	}
	if f.executed() != 8 || rep.Effect.Expected != 8 || rep.Effect.After != 8 {
		t.Errorf("the fake executed %d, the report expects %d and read %d; want 8", f.executed(), rep.Effect.Expected, rep.Effect.After)
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
	if failed, na := statuses(rep, probe.Fail), statuses(rep, probe.NotApplicable); len(failed) != 0 ||
		!slices.Equal(na, []string{"effect", "reordered-json", "stored-4xx"}) {
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
		{probe.Config{URL: "http://x/", Profiles: []string{"stripe", "nope"}}, "Profiles"},
	} {
		_, err := probe.Run(context.Background(), &c.cfg)
		var ce *probe.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || ce.Msg == "" {
			t.Errorf("%+v: %v; want a ConfigError on %s", c.cfg, err, c.field)
		}
	}
}
