package idemhttp

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"math/bits"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// maxJSONDepth is the deepest nesting CanonicalJSON accepts, the same as
// encoding/json's.
const maxJSONDepth = 10000

// CanonicalJSON appends the canonical form of the JSON text src to dst and
// returns the extended slice. The canonical form, which FingerprintV1
// hashes, is:
//
//   - no insignificant whitespace;
//   - object members sorted by key, comparing the keys' Unicode code points
//     (the byte order of their UTF-8 form; RFC 8785 compares UTF-16 code
//     units instead, which differs only between keys holding characters
//     above U+FFFF and keys holding U+E000–U+FFFF);
//   - numbers exactly as written (1, 1.0 and 1e0 stay different);
//   - strings re-escaped: '"' and '\' as \" and \\, U+0008, U+000C,
//     U+000A, U+000D and U+0009 as \b \f \n \r \t, other characters below
//     U+0020 as \u00XX (lower-case hex), an unpaired surrogate escape as
//     \uXXXX (lower-case hex), every other character as its UTF-8 bytes
//     (so "\u00e9" and "é" are the same, and "/" is never escaped).
//
// src must be one JSON value (RFC 8259) in UTF-8, nested at most 10000
// deep, with optional whitespace around it, and its objects must not be
// ambiguous: no object may hold two members whose names encoding/json can
// take for the same name, because sorting such members would hide which
// came last, and encoding/json keeps the last. Two names are taken for the
// same when, decoded (escapes resolved, an unpaired surrogate as U+FFFD,
// as encoding/json decodes it), they are equal; or equal under the
// case-folding encoding/json uses to match struct fields (ASCII letters,
// and Unicode simple folding: "K" = "k" = "\u212a" (Kelvin sign), "S" =
// "s" = "ſ"); or both are integers of the same value, as a map with
// integer keys reads them ("1", "01", "+1"). Otherwise CanonicalJSON
// returns dst (its length unchanged; bytes past it may have been written)
// and an error that says where src went wrong. Canonicalising a canonical
// text returns it unchanged. dst may share memory with src:
// CanonicalJSON(buf[:0], buf) canonicalises buf in place.
//
// Only those names are caught. A map whose key type implements
// encoding.TextUnmarshaler (netip.Addr reads "::1" and "0::1" as one
// address), a type with its own UnmarshalJSON, or a decoder that matches
// names otherwise (encoding/json/v2 with case-insensitive names also
// ignores '-' and '_') can take two names CanonicalJSON keeps apart for
// one, and then the member order, which the canonical form drops, decides
// what the handler reads. A handler that decodes into such types must
// refuse such bodies itself, or its route must hash the body as raw bytes
// (Config.Fingerprint).
func CanonicalJSON(dst, src []byte) ([]byte, error) {
	if overlaps(dst[len(dst):cap(dst)], src) {
		// The canonicalizer writes ahead of what it has read when it
		// puts an object in order (from src straight into out): src must
		// not be the memory it writes, as in CanonicalJSON(buf[:0], buf).
		src = bytes.Clone(src)
	}
	st := fpPool.Get().(*fpState)
	c := &st.canon
	c.begin(src, dst)
	out, err := c.canonical()
	c.src, c.out = nil, nil
	st.put()
	if err != nil {
		return dst, err
	}
	return out, nil
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// canonicalizer holds the state of one canonicalisation. Its scratch
// slices (keys, members, stack, tmp) may be reused across runs.
type canonicalizer struct {
	src   []byte
	out   []byte      // the output, as begin set it, and as canonical returns it
	stack []container // the objects and arrays being parsed, outermost first
	keys  []byte      // keys not read in src (see member), decoded, a stack
	mem   []member    // members of the objects being parsed, a stack
	tmp   []byte      // scratch: the text with every object's members in order
	fold  []byte      // scratch: the folded names of one object
	spans []span      // scratch: where each folded name is in fold
	// The objects whose members are out of order, and their members in
	// order: the text is written as read, and put in order once at the
	// end, so that each byte is copied once however deep such objects
	// nest.
	unsorted []object
	ordered  []span // the text of each member ("key":value) in out
	moved    int    // bytes copied to put members in order (the tests read it)
	// lastInPlace is where in out the last object put in order in place
	// starts (-1: none yet).
	lastInPlace int
	// reference turns the shortcuts off (no pairwise name comparison, no
	// putting in order in place), for the tests that compare the two.
	reference bool
}

// container is an object or an array being parsed.
type container struct {
	object  bool
	sorted  bool // an object whose members so far are in order
	start   int  // where it starts in src
	open    int  // where it starts in out
	memBase int  // where an object's members start in mem
	keyBase int  // where an object's decoded keys start in keys
}

// object is an object of out whose members are out of order: its text
// out[start:end] ('{' to '}'), and its members in order,
// ordered[first:last].
type object struct {
	start, end  int
	first, last int
}

// span is a range of a byte slice.
type span struct{ start, end int }

// member is one object member: its decoded key, and its canonical text
// ("key":value) in out. A key without escapes whose characters are all
// ASCII and need none is its own decoded form, and is read in src; any
// other is decoded into keys.
type member struct {
	keyStart, keyEnd int
	start, end       int
	prefix           uint64 // keyPrefix of the key
	decoded          bool   // the key is keys[keyStart:keyEnd], not src[keyStart:keyEnd]
	plain            bool   // the key is a plain name (isPlainName)
}

// key returns m's decoded key.
func (c *canonicalizer) key(m *member) []byte {
	if m.decoded {
		return c.keys[m.keyStart:m.keyEnd]
	}
	return c.src[m.keyStart:m.keyEnd]
}

// compareKeys compares the keys of a and b, as bytes.Compare.
func (c *canonicalizer) compareKeys(a, b *member) int {
	if a.prefix != b.prefix {
		if a.prefix < b.prefix {
			return -1
		}
		return 1
	}
	return bytes.Compare(c.key(a), c.key(b))
}

// keyPrefix returns the first eight bytes of key, zero-padded, read
// big-endian: keys whose prefixes differ order as their prefixes.
func keyPrefix(key []byte) uint64 {
	var p uint64
	for i := range 8 {
		p <<= 8
		if i < len(key) {
			p |= uint64(key[i])
		}
	}
	return p
}

// jsonError reports where and why a text is not JSON, or is ambiguous.
type jsonError struct {
	offset    int
	msg       string
	ambiguous bool
}

func (e *jsonError) Error() string {
	what := "invalid"
	if e.ambiguous {
		what = "ambiguous"
	}
	return "idemhttp: " + what + " JSON at byte " + strconv.Itoa(e.offset) + ": " + e.msg
}

// errAt reports that the text is not JSON at byte pos.
func errAt(pos int, msg string) error {
	return &jsonError{offset: pos, msg: msg}
}

// begin readies c to canonicalise src, appending to out.
func (c *canonicalizer) begin(src, out []byte) {
	c.src, c.out = src, out
	c.stack, c.keys, c.mem = c.stack[:0], c.keys[:0], c.mem[:0]
	c.unsorted, c.ordered = c.unsorted[:0], c.ordered[:0]
	c.moved = 0
	c.lastInPlace = -1
}

func (c *canonicalizer) canonical() ([]byte, error) {
	src := c.src
	base := len(c.out)
	pos := skipSpace(src, 0)
	if pos == len(src) {
		return nil, errAt(pos, "no value")
	}
	out, pos, err := c.parse(c.out, pos)
	if err != nil {
		return nil, err
	}
	if pos = skipSpace(src, pos); pos != len(src) {
		return nil, errAt(pos, "data after the value")
	}
	c.out = out
	if len(c.unsorted) > 0 {
		// Recorded as they closed (inner first): order them by position.
		slices.SortFunc(c.unsorted, func(a, b object) int { return cmp.Compare(a.start, b.start) })
		c.tmp = c.emit(c.tmp[:0], base, len(c.out))
		c.moved += len(c.tmp)
		c.out = append(c.out[:base], c.tmp...)
	}
	return c.out, nil
}

// emit appends out[lo:hi] to dst with the members of every object out of
// order in it put in order.
func (c *canonicalizer) emit(dst []byte, lo, hi int) []byte {
	for {
		i, _ := slices.BinarySearchFunc(c.unsorted, lo, func(o object, pos int) int { return cmp.Compare(o.start, pos) })
		if i == len(c.unsorted) || c.unsorted[i].start >= hi {
			return append(dst, c.out[lo:hi]...)
		}
		o := c.unsorted[i]
		dst = append(dst, c.out[lo:o.start]...)
		dst = append(dst, '{')
		for k, m := range c.ordered[o.first:o.last] {
			if k > 0 {
				dst = append(dst, ',')
			}
			dst = c.emit(dst, m.start, m.end)
		}
		dst = append(dst, '}')
		lo = o.end
	}
}

// jsonSpace has the bit 1<<b set for each whitespace byte b of JSON.
const jsonSpace uint64 = 1<<' ' | 1<<'\t' | 1<<'\n' | 1<<'\r'

// skipSpace returns the position of the first byte of src from pos on
// that is not whitespace.
func skipSpace(src []byte, pos int) int {
	for pos < len(src) && src[pos] <= ' ' && jsonSpace&(1<<src[pos]) != 0 {
		pos++
	}
	return pos
}

// flushSpace skips the whitespace at src[pos:] for parse (which calls it
// only at a byte up to ' '): it returns out with the pending run
// src[run:pos] appended, and the position after the whitespace as the
// new run and position.
func flushSpace(out, src []byte, run, pos int) ([]byte, int, int) {
	if end := skipSpace(src, pos); end > pos {
		out = append(out, src[run:pos]...)
		return out, end, end
	}
	return out, run, pos
}

// parse parses the value at src[pos] (whitespace skipped) and appends
// its canonical form to out; it returns out and the position after the
// value.
//
// It runs through the text in one loop, keeping the objects and arrays
// it is in on a stack, rather than call itself for each value, so that
// out and the position stay in registers. Text that is its own canonical
// form (all but whitespace and some escapes) is not copied token by
// token: the canonical form so far is out followed by src[run:pos], and
// src[run:pos] is appended to out only when something else must follow
// it (or an object must be put in order in place).
func (c *canonicalizer) parse(out []byte, pos int) ([]byte, int, error) {
	src := c.src
	run := pos
	for {
		// A value at pos, whitespace skipped.
		if pos >= len(src) {
			return out, pos, errAt(pos, "unexpected end")
		}
		opened := false // an object was opened, and its first key is next
		switch ch := src[pos]; {
		case ch == '"':
			// safeEnd, inline (too costly for the compiler to inline).
			i := pos + 1
			if i+8 <= len(src) {
				if f := unsafeBytes(binary.LittleEndian.Uint64(src[i:])); f != 0 {
					i += bits.TrailingZeros64(f) / 8
				} else {
					i = safeEnd(src, i+8)
				}
			} else {
				i = safeEnd(src, i)
			}
			if i < len(src) && src[i] == '"' {
				pos = i + 1
				break
			}
			var err error
			if out, run, pos, err = c.strSlow(out, run, pos, i, false); err != nil {
				return out, pos, err
			}
		case ch == '{':
			if len(c.stack) >= maxJSONDepth {
				return out, pos, errAt(pos, "nested too deep")
			}
			// Appended zero, then set: a struct built whole and copied
			// costs a stalled load.
			c.stack = append(c.stack, container{})
			top := &c.stack[len(c.stack)-1]
			top.object, top.sorted, top.start, top.open = true, true, pos, len(out)+pos-run
			top.memBase, top.keyBase = len(c.mem), len(c.keys)
			if pos++; pos < len(src) && src[pos] <= ' ' {
				out, run, pos = flushSpace(out, src, run, pos)
			}
			if pos < len(src) && src[pos] == '}' {
				pos++
				c.stack = c.stack[:len(c.stack)-1]
				break
			}
			opened = true
		case ch == '[':
			if len(c.stack) >= maxJSONDepth {
				return out, pos, errAt(pos, "nested too deep")
			}
			c.stack = append(c.stack, container{})
			top := &c.stack[len(c.stack)-1]
			top.start, top.open = pos, len(out)+pos-run
			if pos++; pos < len(src) && src[pos] <= ' ' {
				out, run, pos = flushSpace(out, src, run, pos)
			}
			if pos < len(src) && src[pos] == ']' {
				pos++
				c.stack = c.stack[:len(c.stack)-1]
				break
			}
			continue
		case ch == '-' || '0' <= ch && ch <= '9':
			i := pos
			if ch == '-' {
				i++
			}
			if i >= len(src) || src[i] < '0' || src[i] > '9' {
				return out, i, errAt(i, "invalid number")
			}
			if src[i] == '0' {
				i++
			} else {
				for i++; i < len(src) && '0' <= src[i] && src[i] <= '9'; i++ {
				}
			}
			if i < len(src) && src[i] == '.' {
				i++
				d := i
				for i < len(src) && '0' <= src[i] && src[i] <= '9' {
					i++
				}
				if i == d {
					return out, i, errAt(i, "invalid number: no digit after '.'")
				}
			}
			if i < len(src) && src[i]|0x20 == 'e' {
				i++
				if i < len(src) && (src[i] == '+' || src[i] == '-') {
					i++
				}
				d := i
				for i < len(src) && '0' <= src[i] && src[i] <= '9' {
					i++
				}
				if i == d {
					return out, i, errAt(i, "invalid number: no digit in the exponent")
				}
			}
			pos = i
		case ch == 't':
			if len(src)-pos < 4 || string(src[pos:pos+4]) != "true" {
				return out, pos, errAt(pos, "invalid literal")
			}
			pos += 4
		case ch == 'f':
			if len(src)-pos < 5 || string(src[pos:pos+5]) != "false" {
				return out, pos, errAt(pos, "invalid literal")
			}
			pos += 5
		case ch == 'n':
			if len(src)-pos < 4 || string(src[pos:pos+4]) != "null" {
				return out, pos, errAt(pos, "invalid literal")
			}
			pos += 4
		default:
			return out, pos, errAt(pos, "unexpected character "+strconv.QuoteRuneToASCII(rune(ch)))
		}

		// After a value, or after the '{' of an object just opened:
		// close what ends here, then go to the next value.
		for {
			if len(c.stack) == 0 {
				return append(out, src[run:pos]...), pos, nil
			}
			top := &c.stack[len(c.stack)-1]
			if !opened {
				if top.object {
					c.mem[len(c.mem)-1].end = len(out) + pos - run
				}
				if pos < len(src) && src[pos] <= ' ' {
					out, run, pos = flushSpace(out, src, run, pos)
				}
				if pos >= len(src) {
					if top.object {
						return out, pos, errAt(pos, "unexpected end in an object")
					}
					return out, pos, errAt(pos, "unexpected end in an array")
				}
				ch := src[pos]
				if !top.object {
					if ch == ']' {
						pos++
						c.stack = c.stack[:len(c.stack)-1]
						continue
					}
					if ch != ',' {
						return out, pos, errAt(pos, "expected ',' or ']' in an array")
					}
					if pos++; pos < len(src) && src[pos] <= ' ' {
						out, run, pos = flushSpace(out, src, run, pos)
					}
					break
				}
				if ch == '}' {
					pos++
					var err error
					if out, run, err = c.closeObject(out, run, pos); err != nil {
						return out, pos, err
					}
					continue
				}
				if ch != ',' {
					return out, pos, errAt(pos, "expected ',' or '}' in an object")
				}
				pos++
				if pos < len(src) && src[pos] <= ' ' {
					out, run, pos = flushSpace(out, src, run, pos)
				}
			}
			opened = false

			// A member's key, then ':'.
			if pos >= len(src) || src[pos] != '"' {
				return out, pos, errAt(pos, "expected a string key in an object")
			}
			start := len(out) + pos - run
			var key []byte
			decoded := false
			// safeEnd, inline, and the key's keyPrefix if it ends there.
			keyStart, keyEnd := pos+1, pos+1
			var prefix uint64
			if keyStart+8 <= len(src) {
				v := binary.LittleEndian.Uint64(src[keyStart:])
				if f := unsafeBytes(v); f != 0 {
					n := bits.TrailingZeros64(f) / 8
					keyEnd += n
					prefix = bits.ReverseBytes64(v) &^ (^uint64(0) >> (8 * n))
				} else {
					keyEnd = safeEnd(src, keyStart+8)
					prefix = bits.ReverseBytes64(v)
				}
			} else {
				keyEnd = safeEnd(src, keyStart)
				prefix = keyPrefix(src[keyStart:keyEnd])
			}
			if keyEnd < len(src) && src[keyEnd] == '"' {
				key = src[keyStart:keyEnd]
				pos = keyEnd + 1
			} else {
				decoded, keyStart = true, len(c.keys)
				var err error
				if out, run, pos, err = c.strSlow(out, run, pos, keyEnd, true); err != nil {
					return out, pos, err
				}
				keyEnd = len(c.keys)
				key = c.keys[keyStart:keyEnd]
				prefix = keyPrefix(key)
			}
			if top.sorted && len(c.mem) > top.memBase {
				prev := &c.mem[len(c.mem)-1]
				if prev.prefix != prefix {
					top.sorted = prev.prefix < prefix
				} else {
					top.sorted = bytes.Compare(c.key(prev), key) <= 0
				}
			}
			c.mem = append(c.mem, member{})
			m := &c.mem[len(c.mem)-1]
			m.keyStart, m.keyEnd, m.start, m.prefix, m.decoded = keyStart, keyEnd, start, prefix, decoded
			// No integer starts above '9'.
			m.plain = !decoded && len(key) > 0 && key[0] > '9' || isPlainName(key)
			if pos < len(src) && src[pos] <= ' ' {
				out, run, pos = flushSpace(out, src, run, pos)
			}
			if pos >= len(src) || src[pos] != ':' {
				return out, pos, errAt(pos, "expected ':' after an object key")
			}
			if pos++; pos < len(src) && src[pos] <= ' ' {
				out, run, pos = flushSpace(out, src, run, pos)
			}
			break
		}
	}
}

// closeObject ends the object on top of the stack, whose '}' is at
// src[pos-1], for parse: it refuses it if it is ambiguous, and puts its
// members in order, in out at once or in unsorted for the end. It
// returns out and the run (see parse).
func (c *canonicalizer) closeObject(out []byte, run, pos int) ([]byte, int, error) {
	top := c.stack[len(c.stack)-1]
	c.stack = c.stack[:len(c.stack)-1]
	members := c.mem[top.memBase:]
	if len(members) > 1 && c.ambiguous(members) {
		return out, run, &jsonError{offset: top.start, ambiguous: true, msg: "two members of an object have the same member name " +
			"(exactly, or as encoding/json matches names: case-insensitively, or as the same integer)"}
	}
	if !top.sorted {
		// No two names are equal (the object is not ambiguous).
		if len(members) <= 12 {
			// Insertion sort, shifting rather than swapping.
			for i := 1; i < len(members); i++ {
				m := members[i]
				j := i
				for ; j > 0; j-- {
					p := &members[j-1]
					if p.prefix < m.prefix || p.prefix == m.prefix && bytes.Compare(c.key(p), c.key(&m)) < 0 {
						break
					}
					members[j] = *p
				}
				members[j] = m
			}
		} else {
			slices.SortFunc(members, func(a, b member) int { return c.compareKeys(&a, &b) })
		}
		// An object with nothing put in order inside it is put in order
		// at once, in place: its text is final but for the order of its
		// members. One with something inside put in order (in place, or
		// left for the end) is left for the end, so that no byte moves
		// in place twice.
		open := top.open
		if !c.reference && c.lastInPlace < open && (len(c.unsorted) == 0 || c.unsorted[len(c.unsorted)-1].start < open) {
			if shift := run - len(out); open >= len(out) {
				// Its text is still all in the run (src[open+shift:pos]):
				// append it from there in order.
				out = append(out, c.src[run:open+shift+1]...)
				for k := range members {
					if k > 0 {
						out = append(out, ',')
					}
					out = append(out, c.src[members[k].start+shift:members[k].end+shift]...)
				}
				out = append(out, '}')
				run = pos
				c.moved += pos - 2 - (open + shift)
			} else {
				out, run = append(out, c.src[run:pos]...), pos
				tmp := c.tmp[:0]
				for k := range members {
					if k > 0 {
						tmp = append(tmp, ',')
					}
					tmp = append(tmp, out[members[k].start:members[k].end]...)
				}
				copy(out[open+1:], tmp)
				c.tmp = tmp
				c.moved += len(tmp)
			}
			c.lastInPlace = open
		} else {
			first := len(c.ordered)
			for _, m := range members {
				c.ordered = append(c.ordered, span{m.start, m.end})
			}
			c.unsorted = append(c.unsorted, object{start: open, end: len(out) + pos - run, first: first, last: len(c.ordered)})
		}
	}
	c.mem = c.mem[:top.memBase]
	c.keys = c.keys[:top.keyBase]
	return out, run, nil
}

// ambiguous reports whether two of an object's members have names that
// encoding/json can take for the same (see CanonicalJSON).
func (c *canonicalizer) ambiguous(members []member) bool {
	if len(members) <= 8 && !c.reference {
		// Few members: compare each pair, most at a glance. A plain
		// name folds to a name of its own length, its first eight bytes
		// to foldPrefix of its prefix.
		var folded [8]uint64
		for i := range members {
			folded[i] = foldPrefix(members[i].prefix)
		}
		for i := 1; i < len(members); i++ {
			a := &members[i]
			for j := range i {
				b := &members[j]
				if a.plain && b.plain {
					if a.keyEnd-a.keyStart != b.keyEnd-b.keyStart || folded[i] != folded[j] {
						continue
					}
					if a.keyEnd-a.keyStart <= 8 {
						return true // all folded alike
					}
				}
				if c.sameName(c.key(a), c.key(b), a.plain && b.plain) {
					return true
				}
			}
		}
		return false
	}
	fold, spans := c.fold[:0], c.spans[:0]
	for _, m := range members {
		start := len(fold)
		fold = appendFoldedName(fold, c.key(&m))
		spans = append(spans, span{start, len(fold)})
	}
	c.fold, c.spans = fold, spans
	if len(spans) == 2 {
		return bytes.Equal(fold[spans[0].start:spans[0].end], fold[spans[1].start:spans[1].end])
	}
	slices.SortFunc(spans, func(a, b span) int {
		return bytes.Compare(fold[a.start:a.end], fold[b.start:b.end])
	})
	for i := 1; i < len(spans); i++ {
		if bytes.Equal(fold[spans[i-1].start:spans[i-1].end], fold[spans[i].start:spans[i].end]) {
			return true
		}
	}
	return false
}

// sameName reports whether encoding/json can take the decoded member
// names a and b for the same name: whether they fold alike
// (appendFoldedName). plain says both are plain names (isPlainName).
func (c *canonicalizer) sameName(a, b []byte, plain bool) bool {
	if plain {
		// Each character folds to itself or its upper case.
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			x, y := a[i], b[i]
			if 'a' <= x && x <= 'z' {
				x -= 'a' - 'A'
			}
			if 'a' <= y && y <= 'z' {
				y -= 'a' - 'A'
			}
			if x != y {
				return false
			}
		}
		return true
	}
	fold := appendFoldedName(c.fold[:0], a)
	n := len(fold)
	fold = appendFoldedName(fold, b)
	c.fold = fold
	return bytes.Equal(fold[:n], fold[n:])
}

// foldPrefix returns the keyPrefix of a plain name (isPlainName) with
// its letters in upper case: the keyPrefix of its folded form.
func foldPrefix(p uint64) uint64 {
	// Each byte is ASCII: adding 0x1F sets its high bit from 'a' on,
	// adding 0x05 from 'z'+1 on, and neither carries to the next byte.
	const ones = 0x0101010101010101
	lower := (p + ones*0x1F) &^ (p + ones*0x05) & (ones * 0x80)
	return p &^ (lower >> 2)
}

// isPlainName reports whether a decoded member name is all ASCII and no
// integer: its folded form is its own bytes with letters in upper case.
func isPlainName(name []byte) bool {
	for _, ch := range name {
		if ch >= utf8.RuneSelf {
			return false
		}
	}
	_, _, integer := integerName(name)
	return !integer
}

// appendFoldedName appends the form of a decoded member name (as the
// canonicalizer keeps it: UTF-8, with surrogates in generalised UTF-8)
// that is equal for two names exactly when encoding/json may take them for
// the same name: an integer ([+-]?[0-9]+) as its value (sign, then digits
// without leading zeros; 0 unsigned); any other name with each unpaired
// surrogate as U+FFFD, ASCII letters in upper case and every other
// character as the smallest character of its Unicode simple-folding orbit
// (encoding/json's foldName). No other name folds to an integer's form:
// digits and signs fold only to themselves.
func appendFoldedName(b, name []byte) []byte {
	if digits, neg, ok := integerName(name); ok {
		if neg {
			b = append(b, '-')
		}
		return append(b, digits...)
	}
	for i := 0; i < len(name); {
		ch := name[i]
		if ch < utf8.RuneSelf {
			if 'a' <= ch && ch <= 'z' {
				ch -= 'a' - 'A'
			}
			b = append(b, ch)
			i++
			continue
		}
		r, size := utf8.DecodeRune(name[i:])
		if r == utf8.RuneError && size == 1 {
			size = 3 // a surrogate, which encoding/json decodes as U+FFFD
		}
		b = utf8.AppendRune(b, foldRune(r))
		i += size
	}
	return b
}

// integerName reports whether name is an integer as strconv.ParseInt and
// ParseUint read a map key (base 10: an optional sign, then digits), and
// returns its digits without leading zeros and whether it is negative
// (never for zero).
func integerName(name []byte) (digits []byte, neg, ok bool) {
	if len(name) > 0 && (name[0] == '+' || name[0] == '-') {
		neg = name[0] == '-'
		name = name[1:]
	}
	if len(name) == 0 {
		return nil, false, false
	}
	for _, ch := range name {
		if ch < '0' || ch > '9' {
			return nil, false, false
		}
	}
	for len(name) > 1 && name[0] == '0' {
		name = name[1:]
	}
	if name[0] == '0' {
		neg = false
	}
	return name, neg, true
}

// foldRune returns the smallest rune of r's simple-folding orbit, as
// encoding/json does.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// strSafe[b] reports whether the byte b stands for itself in a string,
// in the canonical form and decoded: ASCII from U+0020 on, but for '"'
// and '\'.
var strSafe = func() (safe [256]bool) {
	for b := ' '; b < utf8.RuneSelf; b++ {
		safe[b] = b != '"' && b != '\\'
	}
	return safe
}()

// safeEnd returns the end of the run of bytes of src from i on that
// stand for themselves in a string (strSafe).
func safeEnd(src []byte, i int) int {
	for i+8 <= len(src) {
		if f := unsafeBytes(binary.LittleEndian.Uint64(src[i:])); f != 0 {
			return i + bits.TrailingZeros64(f)/8
		}
		i += 8
	}
	for i < len(src) && strSafe[src[i]] {
		i++
	}
	return i
}

// unsafeBytes flags (with its high bit) each byte of the eight in v, read
// little-endian, that may not stand for itself in a string (strSafe):
// below 0x20, '"', '\\' or above 0x7F. A borrow can flag a byte wrongly,
// but only above one rightly flagged, so the lowest flag is right.
func unsafeBytes(v uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, bs := v^(ones*'"'), v^(ones*'\\')
	return ((v-ones*0x20)&^v | (q-ones)&^q | (bs-ones)&^bs | v) & highs
}

// strSlow parses the rest of the string at src[pos] for parse, from
// src[i], the first byte that may not stand for itself (strSafe): it
// appends to out what its canonical form needs beyond the run (see
// parse), and returns out, the run and the position after the string.
// With key it also appends the decoded string to keys (an unpaired
// surrogate as its three-byte generalised UTF-8 form, so that keys order
// by code point).
func (c *canonicalizer) strSlow(out []byte, run, pos, i int, key bool) ([]byte, int, int, error) {
	src := c.src
	if key {
		c.keys = append(c.keys, src[pos+1:i]...)
	}
	for {
		if i >= len(src) {
			return out, run, i, errAt(i, "unterminated string")
		}
		switch ch := src[i]; {
		case ch == '"':
			return out, run, i + 1, nil
		case ch < 0x20:
			return out, run, i, errAt(i, "control character in a string")
		case ch >= utf8.RuneSelf:
			// Valid UTF-8 stands for itself.
			r, size := utf8.DecodeRune(src[i:])
			if r == utf8.RuneError && size <= 1 {
				return out, run, i, errAt(i, "invalid UTF-8 in a string")
			}
			if key {
				c.keys = append(c.keys, src[i:i+size]...)
			}
			i += size
		default: // '\\'
			if i+1 >= len(src) {
				return out, run, i, errAt(i, "unterminated escape")
			}
			esc := i
			var r rune
			switch e := src[i+1]; e {
			case '"', '\\', '/':
				r = rune(e)
				i += 2
			case 'b':
				r, i = '\b', i+2
			case 'f':
				r, i = '\f', i+2
			case 'n':
				r, i = '\n', i+2
			case 'r':
				r, i = '\r', i+2
			case 't':
				r, i = '\t', i+2
			case 'u':
				u, ok := hex4(src, i+2)
				if !ok {
					return out, run, i, errAt(i, `invalid \u escape`)
				}
				i += 6
				r = rune(u)
				if utf16IsHigh(r) {
					if lo, ok := hex4(src, i+2); ok && i+1 < len(src) && src[i] == '\\' && src[i+1] == 'u' && utf16IsLow(rune(lo)) {
						r = 0x10000 + (r-0xD800)<<10 + (rune(lo) - 0xDC00)
						i += 6
					}
				}
			default:
				return out, run, i, errAt(i, "invalid escape")
			}
			out = append(out, src[run:esc]...)
			out = appendCanonicalRune(out, r)
			run = i
			if key {
				c.keys = appendGeneralisedUTF8(c.keys, r)
			}
		}
		if start := i; i < len(src) && strSafe[src[i]] {
			i = safeEnd(src, i)
			if key {
				c.keys = append(c.keys, src[start:i]...)
			}
		}
	}
}

func utf16IsHigh(r rune) bool { return 0xD800 <= r && r <= 0xDBFF }
func utf16IsLow(r rune) bool  { return 0xDC00 <= r && r <= 0xDFFF }

// hex4 reads four hex digits at src[i:].
func hex4(src []byte, i int) (uint16, bool) {
	if i < 0 || i+4 > len(src) {
		return 0, false
	}
	var v uint16
	for _, ch := range src[i : i+4] {
		var d byte
		switch {
		case '0' <= ch && ch <= '9':
			d = ch - '0'
		case 'a' <= ch && ch <= 'f':
			d = ch - 'a' + 10
		case 'A' <= ch && ch <= 'F':
			d = ch - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(d)
	}
	return v, true
}

const lowerHex = "0123456789abcdef"

// appendCanonicalRune appends r as it appears inside a canonical string.
func appendCanonicalRune(b []byte, r rune) []byte {
	switch {
	case r == '"':
		return append(b, '\\', '"')
	case r == '\\':
		return append(b, '\\', '\\')
	case r == '\b':
		return append(b, '\\', 'b')
	case r == '\f':
		return append(b, '\\', 'f')
	case r == '\n':
		return append(b, '\\', 'n')
	case r == '\r':
		return append(b, '\\', 'r')
	case r == '\t':
		return append(b, '\\', 't')
	case r < 0x20 || utf16IsHigh(r) || utf16IsLow(r):
		return append(b, '\\', 'u', lowerHex[r>>12&0xF], lowerHex[r>>8&0xF], lowerHex[r>>4&0xF], lowerHex[r&0xF])
	}
	return utf8.AppendRune(b, r)
}

// appendGeneralisedUTF8 appends r in UTF-8, encoding a surrogate code
// point as three bytes like any other in its range (which UTF-8 proper
// forbids), so that byte order stays code point order.
func appendGeneralisedUTF8(b []byte, r rune) []byte {
	if utf16IsHigh(r) || utf16IsLow(r) {
		return append(b, byte(0xE0|r>>12), byte(0x80|(r>>6)&0x3F), byte(0x80|r&0x3F))
	}
	return utf8.AppendRune(b, r)
}

// appendJSONString appends s as a canonical JSON string. Invalid UTF-8
// bytes become U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s {
		b = appendCanonicalRune(b, r)
	}
	return append(b, '"')
}
