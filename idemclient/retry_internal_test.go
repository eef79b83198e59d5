package idemclient

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	long := time.Duration(1<<63 - 1)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"99999999999999999999", long, true}, // beyond uint64
		{"9999999999999", long, true},        // beyond time.Duration
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{"Saturday, 01-Mar-25 12:00:30 GMT", 30 * time.Second, true}, // RFC 850
		{"Sat Mar  1 12:00:05 2025", 5 * time.Second, true},          // asctime
		{"Sat, 01 Mar 2025 11:00:00 GMT", 0, true},                   // in the past: no wait
		{"", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// The backoff stays within [0, min(max, base·2ⁿ⁻¹)], and is spread out.
func TestBackoff(t *testing.T) {
	t.Parallel()
	base, maxDelay := 100*time.Millisecond, time.Second
	for attempt := 1; attempt <= 100; attempt++ {
		bound := maxDelay
		if attempt < 5 {
			bound = base << (attempt - 1)
		}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := backoff(base, maxDelay, attempt)
			if d < 0 || d > bound {
				t.Fatalf("attempt %d: backoff %v outside [0, %v]", attempt, d, bound)
			}
			seen[d] = true
		}
		if len(seen) < 100 {
			t.Fatalf("attempt %d: %d distinct waits of 200: not jittered", attempt, len(seen))
		}
	}
	if d := backoff(time.Hour, time.Second, 1); d > time.Second {
		t.Fatalf("a base above the cap waited %v", d)
	}
}
