package outbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
)

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// idTime decodes the unix milliseconds of an ID's first 10 characters.
func idTime(t *testing.T, id string) int64 {
	t.Helper()
	var ms int64
	for _, c := range id[:10] {
		v := strings.IndexRune(crockford, c)
		if v < 0 {
			t.Fatalf("ID %q: %q is not Crockford base32", id, c)
		}
		ms = ms<<5 | int64(v)
	}
	return ms
}

// TestNewID: the prefix, then 26 characters of Crockford base32 whose
// first 48 bits are the time in milliseconds (a ULID); IDs are distinct,
// also many made in one millisecond, and sort as their times.
func TestNewID(t *testing.T) {
	t.Parallel()
	before := time.Now().UnixMilli()
	seen := map[string]bool{}
	var ids []string
	for range 10000 {
		id := outbox.NewID("shop-eu/")
		rest, ok := strings.CutPrefix(id, "shop-eu/")
		if !ok || len(rest) != outbox.IDLen || rest[0] > '7' {
			t.Fatalf("NewID = %q, want shop-eu/ and %d characters, the first 0 to 7", id, outbox.IDLen)
		}
		for _, c := range rest {
			if !strings.ContainsRune(crockford, c) {
				t.Fatalf("NewID = %q: %q is not Crockford base32", id, c)
			}
		}
		if seen[rest] {
			t.Fatalf("NewID gave %q twice", id)
		}
		seen[rest] = true
		ids = append(ids, rest)
	}
	after := time.Now().UnixMilli()
	for i, id := range ids {
		if ms := idTime(t, id); ms < before || ms > after {
			t.Fatalf("ID %q holds %d ms, want between %d and %d", id, ms, before, after)
		}
		if i > 0 && idTime(t, ids[i-1]) < idTime(t, id) && ids[i-1] >= id {
			t.Fatalf("ID %q of an earlier millisecond sorts after %q", ids[i-1], id)
		}
	}
	if id := outbox.NewID(""); len(id) != outbox.IDLen {
		t.Fatalf("NewID(\"\") = %q", id)
	}
}

func BenchmarkNewID(b *testing.B) {
	for b.Loop() {
		_ = outbox.NewID("shop-")
	}
}
