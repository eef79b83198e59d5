package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/rediskey"
)

// recordKey names the record of (scope, key) (see internal/rediskey).
func (s *Store) recordKey(scope, key string) string {
	return rediskey.Name(s.prefix, scope, key)
}

// recordFields are the hash's fields in the order read (lib.lua) returns
// them.
var recordFields = []string{"status", "fp", "owner", "fence", "lease_until", "retention",
	"created_at", "completed_at", "expires_at", "code", "header", "body", "omitted"}

// decodeRecord decodes the fields of a record as HMGET returns them
// (recordFields' order). found is false when the record does not exist.
func decodeRecord(scope, key string, v []any) (rec idem.Record, found bool, err error) {
	if len(v) != len(recordFields) {
		return idem.Record{}, false, fmt.Errorf("record has %d fields, want %d", len(v), len(recordFields))
	}
	if v[0] == nil {
		return idem.Record{}, false, nil
	}
	str := func(i int) string { s, _ := v[i].(string); return s }
	var errs []error
	num := func(i int) int64 {
		s := str(i)
		if s == "" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("field %s: %w", recordFields[i], err))
		}
		return n
	}
	msTime := func(i int) time.Time {
		if n := num(i); n != 0 {
			return time.UnixMilli(n)
		}
		return time.Time{}
	}
	retention := num(5)
	if retention > math.MaxInt64/int64(time.Millisecond) || retention < math.MinInt64/int64(time.Millisecond) {
		// A time.Duration would overflow: no store wrote it.
		errs = append(errs, fmt.Errorf("field retention: %d ms is out of range", retention))
	}
	rec = idem.Record{
		Scope:       scope,
		Key:         key,
		Status:      idem.Status(str(0)),
		Fingerprint: idem.Fingerprint(str(1)),
		Owner:       str(2),
		Fence:       num(3),
		LeaseUntil:  msTime(4),
		Retention:   time.Duration(retention) * time.Millisecond,
		CreatedAt:   msTime(6),
		CompletedAt: msTime(7),
		ExpiresAt:   msTime(8),
	}
	switch rec.Status {
	case idem.StatusProcessing:
	case idem.StatusCompleted:
		resp := &idem.Response{StatusCode: int(num(9)), BodyOmitted: str(12) == "1"}
		if body := str(11); body != "" {
			resp.Body = []byte(body)
		}
		h, err := decodeHeader(str(10))
		if err != nil {
			errs = append(errs, err)
		}
		resp.Header = h
		rec.Response = resp
	default:
		errs = append(errs, fmt.Errorf("status %q", rec.Status))
	}
	if err := errors.Join(errs...); err != nil {
		return idem.Record{}, false, fmt.Errorf("malformed record %s: %w", idem.HashKey(scope, key), err)
	}
	return rec, true, nil
}

// encodeHeader encodes h byte for byte, names sorted, values in order:
// for each name, uvarint length and bytes of the name, uvarint count of
// values, and uvarint length and bytes of each value. Nil and empty
// headers encode to nothing.
func encodeHeader(h map[string][]string) []byte {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	size := 0
	for name, values := range h {
		names = append(names, name)
		size += 2*binary.MaxVarintLen32 + len(name)
		for _, v := range values {
			size += binary.MaxVarintLen32 + len(v)
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	for _, name := range names {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(h[name])))
		for _, v := range h[name] {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

var errHeader = errors.New("malformed header encoding")

// decodeHeader decodes what encodeHeader encoded; "" decodes to nil.
func decodeHeader(s string) (map[string][]string, error) {
	if s == "" {
		return nil, nil
	}
	h := map[string][]string{}
	next := func() (uint64, bool) {
		n, w := binary.Uvarint([]byte(s[:min(len(s), binary.MaxVarintLen64)]))
		if w <= 0 {
			return 0, false
		}
		s = s[w:]
		return n, true
	}
	text := func() (string, bool) {
		n, ok := next()
		if !ok || n > uint64(len(s)) {
			return "", false
		}
		t := s[:n]
		s = s[n:]
		return t, true
	}
	for s != "" {
		name, ok := text()
		if !ok {
			return nil, errHeader
		}
		count, ok := next()
		if !ok || count > uint64(len(s)) { // every value takes at least a byte
			return nil, errHeader
		}
		values := make([]string, count)
		for i := range values {
			if values[i], ok = text(); !ok {
				return nil, errHeader
			}
		}
		h[name] = values
	}
	return h, nil
}
