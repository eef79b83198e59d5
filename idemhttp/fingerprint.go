package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/idemkit/idem"
)

// fingerprintV1Domain starts the hashed input of FingerprintV1.
const fingerprintV1Domain = "idemhttp-fingerprint-v1\n"

// FingerprintV1 is the default fingerprint: "v1:" followed by the
// lower-case hex SHA-256 of the request's method, path, query and body.
// Two requests that differ only in the order of their query parameters
// (of different names), or in the key order and whitespace of a JSON body,
// have the same fingerprint. Request headers and the host are not part of
// it, except that Content-Type decides how the body is read:
//
//   - A body whose Content-Type is application/json or any type with the
//     +json suffix (parameters such as charset ignored, case-insensitive)
//     is hashed in canonical form (see CanonicalJSON). If it is not valid
//     JSON it is hashed as raw bytes instead: the middleware does not refuse
//     it, the handler does. So is a JSON body with an ambiguous object (two
//     members whose names encoding/json can take for the same, such as
//     "quantity" and "Quantity", see CanonicalJSON): sorting its members
//     would give {"quantity":1,"Quantity":1000} and
//     {"Quantity":1000,"quantity":1} one fingerprint although a handler
//     decodes 1000 from the first and 1 from the second. As raw bytes,
//     only the very same body matches it, and identical bytes decode
//     identically. Names that only a handler's own types take for one (a
//     map keyed by netip.Addr reads "::1" and "0::1" as one key) are not
//     caught; see CanonicalJSON.
//   - Any other body (including a form or a JSON text sent as text/plain)
//     is hashed byte for byte.
//
// The hashed input is, with every length an 8-byte big-endian integer:
//
//	"idemhttp-fingerprint-v1\n"
//	len(method) method
//	len(path) path                      path as r.URL.EscapedPath()
//	count                               number of query parameters
//	per parameter, sorted by name (stably: equal names keep their order):
//	  0x00 len(name) name len(value) value     name and value decoded (url.QueryUnescape)
//	  or 0x01 len(name) name len(value) value  as sent, when they do not decode
//	'J' len(body) canonical-JSON-body   or   'R' len(body) raw-body
//
// The tags 'J' and 'R' keep the two forms apart: a raw body never meets a
// canonical one, whatever their bytes.
//
// A body that a Middleware with Config.SpoolBody spooled (one over
// MaxRequestBody) is hashed as 'R' len(body) raw-body whatever its
// Content-Type: the fingerprint FingerprintV1 gives the same request with
// a body it hashes as raw bytes, without holding the body in memory. A
// JSON body so large is thus matched byte for byte, not in canonical form.
//
// Query parameters are split at '&' only, empty ones dropped; "a" and "a="
// are the same parameter. A new version of the algorithm gets a new prefix,
// so that records made with one are never matched against another.
func FingerprintV1(r *http.Request, body []byte) (idem.Fingerprint, error) {
	st := fpPool.Get().(*fpState)
	b := st.appendHead(st.buf[:0], r)
	if len(body) > 0 && isJSONMediaType(r.Header.Get("Content-Type")) {
		n := len(b)
		b = append(b, 'J', 0, 0, 0, 0, 0, 0, 0, 0)
		st.canon.begin(body, b)
		out, err := st.canon.canonical()
		if err == nil {
			binary.BigEndian.PutUint64(out[n+1:], uint64(len(out)-n-9))
			b = out
		} else {
			b = append(st.canon.out[:n], 'R')
			b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
			b = append(b, body...)
		}
		st.canon.src, st.canon.out = nil, nil
	} else {
		b = append(b, 'R')
		b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
		b = append(b, body...)
	}
	sum := sha256.Sum256(b)
	st.buf = b
	st.put()
	return fingerprintV1Of(sum[:]), nil
}

// fingerprintV1Of returns the fingerprint of a hashed input's SHA-256.
func fingerprintV1Of(sum []byte) idem.Fingerprint {
	var fp [3 + 2*sha256.Size]byte
	copy(fp[:], "v1:")
	hex.Encode(fp[3:], sum)
	return idem.Fingerprint(fp[:])
}

// appendHead appends the hashed input of FingerprintV1 up to the body:
// the domain, the method, the path and the query.
func (st *fpState) appendHead(b []byte, r *http.Request) []byte {
	b = append(b, fingerprintV1Domain...)
	b = appendField(b, r.Method)
	var path, rawQuery string
	if r.URL != nil {
		path = r.URL.EscapedPath()
		rawQuery = r.URL.RawQuery
	}
	b = appendField(b, path)
	return st.appendQuery(b, rawQuery)
}

// rawBodyHead returns the hashed input of FingerprintV1 for r with a raw
// body of size bytes, up to the body's bytes: what the fingerprint of a
// spooled body hashes before the body itself. It is a new slice.
func rawBodyHead(r *http.Request, size int64) []byte {
	st := fpPool.Get().(*fpState)
	b := st.appendHead(st.buf[:0], r)
	b = append(b, 'R')
	b = binary.BigEndian.AppendUint64(b, uint64(size))
	head := slices.Clone(b)
	st.buf = b
	st.put()
	return head
}

// fpState is FingerprintV1's pooled scratch.
type fpState struct {
	buf    []byte
	canon  canonicalizer
	params []queryParam
}

type queryParam struct {
	name, value string
	raw         bool
}

var fpPool = sync.Pool{New: func() any { return new(fpState) }}

// maxPooledScratch is the largest scratch buffer returned to a pool; larger
// ones are left to the garbage collector.
const maxPooledScratch = 64 << 10

func (st *fpState) put() {
	if cap(st.buf) > maxPooledScratch {
		st.buf = nil
	}
	if cap(st.canon.tmp) > maxPooledScratch {
		st.canon.tmp = nil
	}
	if cap(st.canon.stack) > maxPooledScratch/48 {
		st.canon.stack = nil
	}
	if cap(st.canon.keys) > maxPooledScratch {
		st.canon.keys = nil
	}
	if cap(st.canon.mem) > maxPooledScratch/32 {
		st.canon.mem = nil
	}
	if cap(st.canon.fold) > maxPooledScratch {
		st.canon.fold = nil
	}
	if cap(st.canon.spans) > maxPooledScratch/16 {
		st.canon.spans = nil
	}
	if cap(st.canon.unsorted) > maxPooledScratch/32 {
		st.canon.unsorted = nil
	}
	if cap(st.canon.ordered) > maxPooledScratch/16 {
		st.canon.ordered = nil
	}
	clear(st.params)
	st.params = st.params[:0]
	fpPool.Put(st)
}

func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// appendQuery appends the canonical query parameters of rawQuery.
func (st *fpState) appendQuery(b []byte, rawQuery string) []byte {
	ps := st.params[:0]
	for rawQuery != "" {
		var seg string
		seg, rawQuery, _ = strings.Cut(rawQuery, "&")
		if seg == "" {
			continue
		}
		name, value, _ := strings.Cut(seg, "=")
		p := queryParam{name: name, value: value}
		n, err1 := url.QueryUnescape(name)
		v, err2 := url.QueryUnescape(value)
		if err1 == nil && err2 == nil {
			p.name, p.value = n, v
		} else {
			p.raw = true
		}
		ps = append(ps, p)
	}
	slices.SortStableFunc(ps, func(a, b queryParam) int { return strings.Compare(a.name, b.name) })
	b = binary.BigEndian.AppendUint64(b, uint64(len(ps)))
	for _, p := range ps {
		if p.raw {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = appendField(b, p.name)
		b = appendField(b, p.value)
	}
	st.params = ps
	return b
}

// isJSONMediaType reports whether a Content-Type names JSON:
// application/json or a +json suffix, any parameters ignored.
func isJSONMediaType(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	const suffix = "+json"
	return asciiEqualFold(ct, "application/json") ||
		len(ct) > len(suffix) && strings.IndexByte(ct, '/') > 0 && asciiEqualFold(ct[len(ct)-len(suffix):], suffix)
}

// asciiEqualFold reports whether a and b are equal but for the case of
// ASCII letters, as media types compare (RFC 9110 §8.3.1).
// strings.EqualFold would also take "ſ" (U+017F) for "s" and "K" (U+212A)
// for "k": "application/jſon" is no JSON type.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
