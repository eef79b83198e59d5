package memstore

import (
	"encoding/binary"
	"errors"
	"strings"

	"github.com/idemkit/idem"
)

// A completed record's response is kept encoded at the end of its
// entry's text, a string, which holds no pointers: the garbage collector
// does not scan it. A store of many completed records then costs the
// collector a few words per record, not a header map, its values and a
// body each, and every allocation in the process pays less for the
// store's size.
//
// The encoding (uvarints, except the flags byte):
//
//	status flags                  flags: 1 header not nil, 2 body not nil, 4 body omitted
//	headerLen header              headerLen: 8 bytes, little-endian
//	                              header: count, values in all, then per name:
//	                                len(name) name (count+1 or 0 for nil) then len(value) value per value
//	body                          the rest
const (
	flagHeader  = 1
	flagBody    = 2
	flagOmitted = 4
)

// appendResponse returns prefix followed by r encoded, as one new
// string.
func appendResponse(prefix string, r *idem.Response) string {
	total := 0
	hlen := uvarintLen(uint64(len(r.Header)))
	for name, values := range r.Header {
		total += len(values)
		hlen += uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(values))+1)
		for _, v := range values {
			hlen += uvarintLen(uint64(len(v))) + len(v)
		}
	}
	hlen += uvarintLen(uint64(total))
	var flags byte
	if r.Header != nil {
		flags |= flagHeader
	}
	if r.Body != nil {
		flags |= flagBody
	}
	if r.BodyOmitted {
		flags |= flagOmitted
	}
	var sb strings.Builder
	var scratch [binary.MaxVarintLen64]byte
	uvarint := func(v uint64) { sb.Write(binary.AppendUvarint(scratch[:0], v)) }
	sb.Grow(len(prefix) + binary.MaxVarintLen64 + 9 + hlen + len(r.Body))
	sb.WriteString(prefix)
	uvarint(uint64(r.StatusCode))
	sb.WriteByte(flags)
	sb.Write(binary.LittleEndian.AppendUint64(scratch[:0], uint64(hlen)))
	uvarint(uint64(len(r.Header)))
	uvarint(uint64(total))
	for name, values := range r.Header {
		uvarint(uint64(len(name)))
		sb.WriteString(name)
		if values == nil {
			uvarint(0)
			continue
		}
		uvarint(uint64(len(values)) + 1)
		for _, v := range values {
			uvarint(uint64(len(v)))
			sb.WriteString(v)
		}
	}
	sb.Write(r.Body)
	return sb.String()
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

var errCorrupt = errors.New("memstore: corrupt stored response")

// decodeResponse returns the response s encodes. Its header's names and
// values are substrings of s; its body is a copy.
func decodeResponse(s string) (*idem.Response, error) {
	p := &reader{s: s}
	status := p.uvarint()
	if p.bad || len(s)-p.i < 9 {
		return nil, errCorrupt
	}
	flags := s[p.i]
	var hlen uint64
	for k := 8; k >= 1; k-- {
		hlen = hlen<<8 | uint64(s[p.i+k])
	}
	p.i += 9
	if hlen > uint64(len(s)-p.i) {
		return nil, errCorrupt
	}
	r := &idem.Response{StatusCode: int(status), BodyOmitted: flags&flagOmitted != 0}
	if flags&flagHeader != 0 {
		h, err := decodeHeader(s[p.i : p.i+int(hlen)])
		if err != nil {
			return nil, err
		}
		r.Header = h
	}
	if body := s[p.i+int(hlen):]; flags&flagBody != 0 {
		r.Body = []byte(body)
	} else if body != "" {
		return nil, errCorrupt
	}
	return r, nil
}

func decodeHeader(s string) (map[string][]string, error) {
	p := &reader{s: s}
	count, total := p.uvarint(), p.uvarint()
	if p.bad || count > uint64(len(s)) || total > uint64(len(s)) {
		return nil, errCorrupt
	}
	h := make(map[string][]string, count)
	all := make([]string, 0, total)
	for range count {
		name := p.str()
		nv := p.uvarint()
		if p.bad || nv > uint64(len(s))+1 {
			return nil, errCorrupt
		}
		if nv == 0 {
			h[name] = nil
			continue
		}
		if nv-1 > uint64(cap(all)-len(all)) {
			return nil, errCorrupt
		}
		first := len(all)
		for range nv - 1 {
			all = append(all, p.str())
		}
		h[name] = all[first:len(all):len(all)]
	}
	if p.bad || p.i != len(s) {
		return nil, errCorrupt
	}
	return h, nil
}

// reader reads uvarints and length-prefixed strings from s.
type reader struct {
	s   string
	i   int
	bad bool
}

func (p *reader) uvarint() uint64 {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		if p.i >= len(p.s) {
			p.bad = true
			return 0
		}
		c := p.s[p.i]
		p.i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
	p.bad = true
	return 0
}

func (p *reader) str() string {
	n := p.uvarint()
	if p.bad || n > uint64(len(p.s)-p.i) {
		p.bad = true
		return ""
	}
	v := p.s[p.i : p.i+int(n)]
	p.i += int(n)
	return v
}
