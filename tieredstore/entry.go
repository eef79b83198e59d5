package tieredstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/rediskey"
)

// entryKey names the record of (scope, key) (see internal/rediskey).
func (s *store) entryKey(scope, key string) string {
	return rediskey.Name(s.prefix, scope, key)
}

// entryVersion is the first byte of every entry. An entry of another
// version is treated as a miss, so a rolling upgrade that changes the
// encoding only costs cache misses. Version 1 kept a time as its Unix
// nanoseconds, which int64 holds only from 1678 to 2262: a record
// expiring later (a retention of a few centuries) came back with another
// ExpiresAt. Version 2 keeps seconds and nanoseconds apart.
const entryVersion = 2

// encodeEntry encodes rec (scope and key excepted: the entry's name holds
// them) as:
//
//	version, status ('p' or 'c'), fingerprint, owner, fence, retention,
//	lease_until, created_at, completed_at, expires_at
//	and, for 'c': code, omitted (0 or 1), header count, each header
//	(name, value count, values, names sorted), body
//
// Strings are a uvarint length and the bytes; integers are varints;
// durations are nanoseconds; a time is a flag byte (0 zero, 1 set) and, if
// set, its Unix seconds (varint) and nanoseconds within the second
// (uvarint, below 1e9), which hold every time a store returns.
func encodeEntry(rec idem.Record) []byte {
	size := 64 + len(rec.Fingerprint) + len(rec.Owner)
	if r := rec.Response; r != nil {
		size += len(r.Body) + 16
		for name, values := range r.Header {
			size += len(name) + 2*binary.MaxVarintLen32
			for _, v := range values {
				size += len(v) + binary.MaxVarintLen32
			}
		}
	}
	b := make([]byte, 0, size)
	b = append(b, entryVersion)
	switch rec.Status {
	case idem.StatusCompleted:
		b = append(b, 'c')
	default:
		b = append(b, 'p')
	}
	b = appendString(b, string(rec.Fingerprint))
	b = appendString(b, rec.Owner)
	b = binary.AppendVarint(b, rec.Fence)
	b = binary.AppendVarint(b, int64(rec.Retention))
	for _, t := range []time.Time{rec.LeaseUntil, rec.CreatedAt, rec.CompletedAt, rec.ExpiresAt} {
		if t.IsZero() {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.AppendVarint(b, t.Unix())
		b = binary.AppendUvarint(b, uint64(t.Nanosecond()))
	}
	if rec.Status != idem.StatusCompleted {
		return b
	}
	resp := rec.Response
	if resp == nil {
		resp = &idem.Response{}
	}
	b = binary.AppendVarint(b, int64(resp.StatusCode))
	if resp.BodyOmitted {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	names := make([]string, 0, len(resp.Header))
	for name := range resp.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(resp.Header[name])))
		for _, v := range resp.Header[name] {
			b = appendString(b, v)
		}
	}
	return appendString(b, string(resp.Body))
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errEntry = errors.New("malformed cache entry")

// entryReader reads what encodeEntry wrote; the first failure sticks.
type entryReader struct {
	b   []byte
	bad bool
}

func (r *entryReader) byte() byte {
	if r.bad || len(r.b) == 0 {
		r.bad = true
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *entryReader) uvarint() uint64 {
	if r.bad {
		return 0
	}
	n, w := binary.Uvarint(r.b)
	if w <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[w:]
	return n
}

func (r *entryReader) varint() int64 {
	if r.bad {
		return 0
	}
	n, w := binary.Varint(r.b)
	if w <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[w:]
	return n
}

// bytes returns the next string, aliasing the entry's buffer.
func (r *entryReader) bytes() []byte {
	n := r.uvarint()
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

func (r *entryReader) time() time.Time {
	switch r.byte() {
	case 0:
		return time.Time{}
	case 1:
		sec, nsec := r.varint(), r.uvarint()
		if nsec >= 1e9 {
			break
		}
		return time.Unix(sec, int64(nsec)).UTC()
	}
	r.bad = true
	return time.Time{}
}

// decodeEntry decodes an entry of (scope, key) that encodeEntry wrote. The
// record's Body aliases b.
func decodeEntry(scope, key string, b []byte) (idem.Record, error) {
	r := &entryReader{b: b}
	if v := r.byte(); v != entryVersion {
		return idem.Record{}, fmt.Errorf("%w: version %d, want %d", errEntry, v, entryVersion)
	}
	rec := idem.Record{Scope: scope, Key: key}
	switch r.byte() {
	case 'p':
		rec.Status = idem.StatusProcessing
	case 'c':
		rec.Status = idem.StatusCompleted
	default:
		return idem.Record{}, fmt.Errorf("%w: unknown status", errEntry)
	}
	rec.Fingerprint = idem.Fingerprint(r.bytes())
	rec.Owner = string(r.bytes())
	rec.Fence = r.varint()
	rec.Retention = time.Duration(r.varint())
	rec.LeaseUntil = r.time()
	rec.CreatedAt = r.time()
	rec.CompletedAt = r.time()
	rec.ExpiresAt = r.time()
	if rec.Status == idem.StatusCompleted {
		resp := &idem.Response{StatusCode: int(r.varint())}
		switch r.byte() {
		case 0:
		case 1:
			resp.BodyOmitted = true
		default:
			r.bad = true
		}
		n := r.uvarint()
		if n > uint64(len(r.b)) { // every header takes at least a byte
			r.bad = true
		}
		if !r.bad && n > 0 {
			resp.Header = make(map[string][]string, n)
			for range n {
				name := string(r.bytes())
				count := r.uvarint()
				if r.bad || count > uint64(len(r.b)) {
					r.bad = true
					break
				}
				values := make([]string, count)
				for i := range values {
					values[i] = string(r.bytes())
				}
				resp.Header[name] = values
			}
		}
		if body := r.bytes(); len(body) > 0 {
			resp.Body = body
		}
		rec.Response = resp
	}
	if r.bad {
		return idem.Record{}, fmt.Errorf("%w: truncated or corrupt", errEntry)
	}
	if len(r.b) != 0 {
		return idem.Record{}, fmt.Errorf("%w: %d trailing bytes", errEntry, len(r.b))
	}
	return rec, nil
}
