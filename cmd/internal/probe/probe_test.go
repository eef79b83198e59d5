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
	}
	return rep
}

func logReport(t *testing.T, rep *probe.Report) {
	t.Helper()
	for _, r := range rep.Checks {
		t.Logf("%-15s %-4s %s", r.ID, r.Status, r.Reason)
	}
}

// TestBrokenAPIs probes APIs that each break one behaviour (and one that
// breaks none): the checks that fail are exactly the ones that behaviour
// breaks, and those not applicable are exactly the ones it makes so.
func TestBrokenAPIs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		k      knobs
		failed []string
		na     []string
	}{
		{"correct", knobs{}, nil, nil},
		{"no idempotency", knobs{noIdempotency: true},
			[]string{"concurrent", "effect", "header-case", "malformed-key", "mismatch-422", "overlong-key", "quoted-key", "reordered-json", "retry-replay", "stored-4xx"},
			[]string{"after-mismatch", "missing-key"}},
		{"replays unmarked", knobs{noReplayHeader: true}, []string{"retry-replay", "stored-4xx"}, nil},
		{"ignores the body", knobs{ignoreBody: true}, []string{"mismatch-422"}, []string{"after-mismatch"}},
		{"raw fingerprint", knobs{rawFingerprint: true}, []string{"reordered-json"}, nil},
		{"poisoned after 422", knobs{poisonAfter422: true}, []string{"after-mismatch"}, nil},
		{"500 without a key", knobs{missing500: true}, []string{"missing-key"}, nil},
		{"accepts overlong keys", knobs{acceptOverlong: true}, []string{"overlong-key"}, nil},
		{"intercepts GET", knobs{interceptGET: true}, []string{"get-untouched"}, nil},
		{"case-sensitive header", knobs{caseSensitive: true}, []string{"header-case"}, nil},
		{"quotes kept in the key", knobs{quotedLiteral: true}, []string{"effect", "quoted-key"}, nil},
		{"4xx not stored", knobs{no4xxStore: true}, []string{"stored-4xx"}, nil},
		{"check then act", knobs{races: true}, []string{"concurrent", "effect"}, nil},
		{"executes retries, answers replays", knobs{reexecutes: true},
			[]string{"after-mismatch", "concurrent", "effect", "header-case", "quoted-key", "reordered-json", "retry-replay"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f, base := startFake(t, c.k)
			rep := run(t, fakeConfig(base))
			failed, na := statuses(rep, probe.Fail), statuses(rep, probe.NotApplicable)
			if !slices.Equal(failed, c.failed) || !slices.Equal(na, c.na) {
				logReport(t, rep)
				t.Errorf("failed %q, n/a %q; want failed %q, n/a %q", failed, na, c.failed, c.na)
			}
			if rep.OK != (len(c.failed) == 0) || rep.Failed != len(c.failed) || rep.NA != len(c.na) ||
				rep.Passed != len(rep.Checks)-len(c.failed)-len(c.na) {
				t.Errorf("report OK %v, %d passed, %d failed, %d n/a; want it to agree with the checks", rep.OK, rep.Passed, rep.Failed, rep.NA)
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
	} {
		_, err := probe.Run(context.Background(), &c.cfg)
		var ce *probe.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || ce.Msg == "" {
			t.Errorf("%+v: %v; want a ConfigError on %s", c.cfg, err, c.field)
		}
	}
}
