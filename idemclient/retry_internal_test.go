package idemclient

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
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
		{"99999999999999999999x", 0, false}, // overflows before the 'x'
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

// FuzzParseRetryAfter checks parseRetryAfter against RFC 9110 §10.2.3: a
// value of decimal digits is that many seconds (saturating at the longest
// time.Duration), a value http.ParseTime reads is the time until that date
// (none when it is past), anything else is refused; a wait is never
// negative, and surrounding spaces do not matter.
func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{"0", "1", " 120 ", "99999999999999999999", "9999999999999",
		now.Add(90 * time.Second).Format(http.TimeFormat), "Saturday, 01-Mar-25 12:00:30 GMT",
		"Sat Mar  1 12:00:05 2025", "Sat, 01 Mar 2025 11:00:00 GMT", "", "-1", "1.5", "soon", "+1", "0x10", "1e3"} {
		f.Add(s, now.UnixNano())
	}
	f.Fuzz(func(t *testing.T, v string, nowNanos int64) {
		now := time.Unix(0, nowNanos)
		d, ok := parseRetryAfter(v, now)
		if d < 0 || !ok && d != 0 {
			t.Fatalf("parseRetryAfter(%q) = %v, %v", v, d, ok)
		}
		trimmed := strings.TrimSpace(v)
		if again, ok2 := parseRetryAfter(" "+trimmed+"\t", now); again != d || ok2 != ok {
			t.Fatalf("%q gives %v, %v; with spaces around, %v, %v", v, d, ok, again, ok2)
		}
		digits := trimmed != "" && strings.Trim(trimmed, "0123456789") == ""
		at, dateErr := http.ParseTime(trimmed)
		switch {
		case digits:
			want := time.Duration(1<<63 - 1)
			if n, err := strconv.ParseUint(trimmed, 10, 64); err == nil && n <= uint64(want/time.Second) {
				want = time.Duration(n) * time.Second
			}
			if !ok || d != want {
				t.Fatalf("parseRetryAfter(%q) = %v, %v; want %v seconds", v, d, ok, want)
			}
		case dateErr == nil:
			if want := max(at.Sub(now), 0); !ok || d != want {
				t.Fatalf("parseRetryAfter(%q) = %v, %v; want %v, the wait until %v", v, d, ok, want, at)
			}
		case ok:
			t.Fatalf("parseRetryAfter(%q) = %v, accepted; it is neither seconds nor an HTTP date", v, d)
		}
	})
}

// FuzzProblemCode checks problemCode on any body and Content-Type: the
// body reads afterwards exactly as sent, whatever its length; the code is
// the "code" member encoding/json finds in the first maxProblem bytes of
// a JSON body, and "" for any other type; at most maxProblem bytes are
// read ahead.
func FuzzProblemCode(f *testing.F) {
	for _, s := range [][2]string{
		{"application/problem+json", `{"type":"about:blank","status":409,"code":"PROCESSING"}`},
		{"application/json; charset=utf-8", `{"code":"PROCESSING","code":"OTHER"}`},
		{"application/problem+json", `{"Code":"PROCESSING"}`},
		{"text/plain", `{"code":"PROCESSING"}`},
		{"application/problem+json", `{"code":1}`},
		{"application/problem+json", `{"code":"PROCESSING"`},
		{"", ""},
		{"application/problem+json", `{"code":"\u0050ROCESSING"} `},
	} {
		f.Add(s[0], []byte(s[1]), uint32(0))
	}
	f.Add("application/problem+json", []byte(`{"code":"PROCESSING","x":"`), uint32(maxProblem))
	f.Fuzz(func(t *testing.T, contentType string, body []byte, pad uint32) {
		// pad spaces after the body, up to twice maxProblem.
		full := append(bytes.Clone(body), bytes.Repeat([]byte{' '}, int(pad%(2*maxProblem)))...)
		src := &countingReader{r: bytes.NewReader(full)}
		resp := &http.Response{Header: http.Header{"Content-Type": {contentType}}, Body: io.NopCloser(src)}
		code := problemCode(resp)
		if src.n > maxProblem {
			t.Fatalf("read %d bytes ahead, more than %d", src.n, maxProblem)
		}
		rest, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(rest, full) {
			t.Fatalf("the body reads %d bytes (%v) after problemCode, want the %d sent", len(rest), err, len(full))
		}
		// The code is read from the first maxProblem bytes only.
		mt, _, err := mime.ParseMediaType(contentType)
		want := ""
		if err == nil && (mt == "application/problem+json" || mt == "application/json") {
			var p struct {
				Code string `json:"code"`
			}
			if json.Unmarshal(full[:min(len(full), maxProblem)], &p) == nil {
				want = p.Code
			}
		}
		if code != want {
			t.Fatalf("problemCode(%q, %.100q) = %q; encoding/json reads %q", contentType, full, code, want)
		}
	})
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
