package natsjs

import "testing"

func TestSubjectMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"events.>", "events.dead.x", true},
		{"events.>", "events", false},
		{">", "a", true},
		{">", "a.b.c", true},
		{"events.*", "events.dead", true},
		{"events.*", "events.dead.x", false},
		{"events.*.x", "events.dead.x", true},
		{"events.*.x", "events.dead.y", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"a.b", "a.b", true},
		{"a.b", "a.bc", false},
		{"a.b", "a", false},
		{"a", "a.b", false},
		{"idem.dead.S.>", "idem.dead.S.loyalty", true},
		{"idem.dead.S.>", "idem.dead.T.loyalty", false},
		{"a.>.c", "a.>.c", true}, // '>' not last is a literal token here
	} {
		if got := SubjectMatches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}

func TestLiteralSubject(t *testing.T) {
	for s, ok := range map[string]bool{"a.b": true, "idem.dead.S.d": true, "": false, "a.*": false, "a.>": false, "a..b": false, "a b": false} {
		if err := literalSubject(s); (err == nil) != ok {
			t.Errorf("literalSubject(%q) = %v, want ok %v", s, err, ok)
		}
	}
}
