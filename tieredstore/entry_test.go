package tieredstore

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

func sampleRecords() map[string]idem.Record {
	now := time.UnixMilli(1_790_000_000_123).UTC()
	return map[string]idem.Record{
		"processing": {
			Scope: "s", Key: "k", Fingerprint: "v1:abc", Status: idem.StatusProcessing,
			Owner: "0123456789abcdef", Fence: 7, LeaseUntil: now.Add(30 * time.Second),
			Retention: 24 * time.Hour, CreatedAt: now, ExpiresAt: now.Add(30*time.Second + 24*time.Hour),
		},
		"completed": {
			Scope: "", Key: "ключ", Fingerprint: "", Status: idem.StatusCompleted,
			Owner: "o", Fence: 1, LeaseUntil: now, Retention: time.Hour, CreatedAt: now.Add(-time.Second),
			CompletedAt: now, ExpiresAt: now.Add(time.Hour),
			Response: &idem.Response{
				StatusCode: 201,
				Header:     map[string][]string{"Location": {"/a"}, "X-Multi": {"1", "", "2"}, "X-Bin": {"\x00\xff"}},
				Body:       []byte{0, 1, 2, 255, 0},
			},
		},
		"omitted": {
			Key: "k", Status: idem.StatusCompleted, Fence: 3, CompletedAt: now, ExpiresAt: now,
			Response: &idem.Response{StatusCode: 200, BodyOmitted: true},
		},
	}
}

func TestEntryRoundTrip(t *testing.T) {
	t.Parallel()
	for name, rec := range sampleRecords() {
		got, err := decodeEntry(rec.Scope, rec.Key, encodeEntry(rec))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, rec) {
			t.Fatalf("%s: decoded\n%+v\nwant\n%+v", name, got, rec)
		}
	}
	// Nil and empty bodies and headers are the same: both come back nil.
	rec := idem.Record{Status: idem.StatusCompleted, Response: &idem.Response{Header: map[string][]string{}, Body: []byte{}}}
	got, err := decodeEntry("", "k", encodeEntry(rec))
	if err != nil || got.Response.Header != nil || got.Response.Body != nil {
		t.Fatalf("empty header and body: %+v, %v", got.Response, err)
	}
}

func TestEntryCorrupt(t *testing.T) {
	t.Parallel()
	b := encodeEntry(sampleRecords()["completed"])
	for i := range b {
		if _, err := decodeEntry("", "k", b[:i]); err == nil {
			t.Fatalf("a %d-byte prefix of a %d-byte entry decoded", i, len(b))
		}
	}
	if _, err := decodeEntry("", "k", append(bytes.Clone(b), 0)); err == nil {
		t.Fatal("an entry with a trailing byte decoded")
	}
	other := bytes.Clone(b)
	other[0] = entryVersion + 1
	if _, err := decodeEntry("", "k", other); err == nil {
		t.Fatal("an entry of another version decoded")
	}
}

func TestEntryKey(t *testing.T) {
	t.Parallel()
	s := &store{prefix: "p"}
	seen := map[string]bool{}
	for _, id := range [][2]string{{"x:y", "z"}, {"x", "y:z"}, {"", "a.b"}, {"a.b", ""}, {"}", "{"}, {"", "}"}} {
		name := s.entryKey(id[0], id[1])
		if seen[name] {
			t.Fatalf("%q names two records", name)
		}
		seen[name] = true
	}
	if got := s.entryKey("t", "k"); got != "p:{dA.aw}" {
		t.Fatalf("entryKey = %q", got)
	}
}

// FuzzDecodeEntry: any bytes decode or fail without panicking, and what
// decodes encodes back to the same bytes.
func FuzzDecodeEntry(f *testing.F) {
	for _, rec := range sampleRecords() {
		f.Add(encodeEntry(rec))
	}
	f.Add([]byte{})
	f.Add([]byte{entryVersion, 'c'})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeEntry("s", "k", b)
		if err != nil {
			return
		}
		again := encodeEntry(rec)
		rec2, err := decodeEntry("s", "k", again)
		if err != nil || !reflect.DeepEqual(rec, rec2) {
			t.Fatalf("re-encoded entry decodes to %+v, %v; want %+v", rec2, err, rec)
		}
	})
}

// FuzzEntryRoundTrip: every record a truth store can return (times in
// whole milliseconds, as SQL and Redis keep them, any of them; any
// strings, header and body) decodes from its entry as it was, and a
// change to any byte of the entry never decodes to the same record.
func FuzzEntryRoundTrip(f *testing.F) {
	f.Add(true, "v1:abc", "0123456789abcdef", int64(7), int64(24*time.Hour), int64(1_790_000_030_123), int64(1_790_000_000_123), int64(0), int64(1_790_086_430_123),
		201, false, "Location", "/a", "X-Bin", "\x00\xff", []byte{0, 1, 2, 255, 0})
	f.Add(false, "", "", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), 0, true, "", "", "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, completed bool, fp, owner string, fence, retention, until, created, done, expires int64,
		code int, omitted bool, n1, v1, n2, v2 string, body []byte) {
		ms := func(v int64) time.Time {
			if v == 0 {
				return time.Time{}
			}
			return time.UnixMilli(v)
		}
		rec := idem.Record{
			Scope: "s", Key: "k", Fingerprint: idem.Fingerprint(fp), Status: idem.StatusProcessing,
			Owner: owner, Fence: fence, Retention: time.Duration(retention) * time.Millisecond,
			LeaseUntil: ms(until), CreatedAt: ms(created), CompletedAt: ms(done), ExpiresAt: ms(expires),
		}
		if completed {
			rec.Status = idem.StatusCompleted
			rec.Response = &idem.Response{StatusCode: code, BodyOmitted: omitted, Body: body,
				Header: map[string][]string{n1: {v1, v2}, n2: {v2}}}
			if len(body) == 0 {
				rec.Response.Body = nil
			}
		}
		b := encodeEntry(rec)
		got, err := decodeEntry("s", "k", b)
		if err != nil {
			t.Fatalf("%+v: %v", rec, err)
		}
		if !sameRecord(got, rec) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, rec)
		}
		// A byte changed: refused, or another record.
		for i := range b {
			other := bytes.Clone(b)
			other[i] ^= 0x5a
			if again, err := decodeEntry("s", "k", other); err == nil && sameRecord(again, rec) {
				t.Fatalf("byte %d of %x changed, the same record decodes", i, b)
			}
		}
	})
}

// sameRecord reports whether a and b are the same record, their times
// compared as instants.
func sameRecord(a, b idem.Record) bool {
	for _, p := range [][2]time.Time{{a.LeaseUntil, b.LeaseUntil}, {a.CreatedAt, b.CreatedAt}, {a.CompletedAt, b.CompletedAt}, {a.ExpiresAt, b.ExpiresAt}} {
		if !p[0].Equal(p[1]) {
			return false
		}
	}
	a.LeaseUntil, a.CreatedAt, a.CompletedAt, a.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	b.LeaseUntil, b.CreatedAt, b.CompletedAt, b.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}
