package memstore

import (
	"encoding/binary"
	"errors"

	"github.com/idemkit/idem"
)

// A completed record's response is kept encoded in one byte slice, which
// holds no pointers: the garbage collector does not scan it. A store of
// many completed records then costs the collector a few pointers per
// record, not a header map, its values and a body each, and every
// allocation in the process pays less for the store's size.
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

// encodeResponse returns r encoded, sharing no memory with r.
func encodeResponse(r *idem.Response) []byte {
	n := 2*binary.MaxVarintLen64 + 1 + len(r.Body)
	for name, values := range r.Header {
		n += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range values {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	b := make([]byte, 0, n+binary.MaxVarintLen64)
	b = binary.AppendUvarint(b, uint64(r.StatusCode))
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
	b = append(b, flags)
	// The header's length first, so that decoding turns it into one
	// string at once.
	lenAt := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	start := len(b)
	total := 0
	for _, values := range r.Header {
		total += len(values)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	b = binary.AppendUvarint(b, uint64(total))
	for name, values := range r.Header {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		if values == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(values))+1)
		for _, v := range values {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	// A fixed-width length: the header's size is known only now.
	binary.LittleEndian.PutUint64(b[lenAt:], uint64(len(b)-start))
	return append(b, r.Body...)
}

var errCorrupt = errors.New("memstore: corrupt stored response")

// decodeResponse returns the response b encodes, sharing no memory with
// b: its header's names and values are substrings of one new string.
func decodeResponse(b []byte) (*idem.Response, error) {
	status, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+1+8 {
		return nil, errCorrupt
	}
	b = b[n:]
	flags := b[0]
	hlen := binary.LittleEndian.Uint64(b[1:])
	b = b[9:]
	if hlen > uint64(len(b)) {
		return nil, errCorrupt
	}
	r := &idem.Response{StatusCode: int(status), BodyOmitted: flags&flagOmitted != 0}
	if flags&flagHeader != 0 {
		h, err := decodeHeader(string(b[:hlen]))
		if err != nil {
			return nil, err
		}
		r.Header = h
	}
	if body := b[hlen:]; flags&flagBody != 0 {
		r.Body = append(make([]byte, 0, len(body)), body...)
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
