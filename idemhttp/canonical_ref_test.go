package idemhttp

// This file keeps the canonicalizer as it was before it was tuned for
// speed (commit cf17368), renamed, as the reference that
// FuzzCanonicalMatchesReference holds the tuned one to: the canonical form
// is hashed into stored fingerprints, so its output and errors must not
// change by a byte.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// refMaxJSONDepth is maxJSONDepth as it was.
const refMaxJSONDepth = 10000

// refCanonicalJSON is CanonicalJSON as it was, without the pool.
func refCanonicalJSON(dst, src []byte) ([]byte, error) {
	var c refCanonicalizer
	c.begin(src, dst)
	out, err := c.canonical()
	if err != nil {
		return dst, err
	}
	return out, nil
}

// refCanonicalizer is canonicalizer as it was: the state of one
// canonicalisation. Its scratch slices (keys, members, tmp) may be reused
// across runs.
type refCanonicalizer struct {
	src   []byte
	pos   int
	depth int
	out   []byte
	keys  []byte      // decoded keys of the objects being parsed, a stack
	mem   []refMember // members of the objects being parsed, a stack
	tmp   []byte      // scratch: the text with every object's members in order
	fold  []byte      // scratch: the folded names of one object
	spans []refSpan   // scratch: where each folded name is in fold
	// The objects whose members are out of order, and their members in
	// order: the text is written as read, and put in order once at the
	// end, so that each byte is copied once however deep such objects
	// nest.
	unsorted []refObject
	ordered  []refSpan // the text of each member ("key":value) in out
	moved    int       // bytes copied to put members in order (the tests read it)
	// lastInPlace is where in out the last object put in order in place
	// starts (-1: none yet).
	lastInPlace int
	// reference turns the shortcuts off (no pairwise name comparison, no
	// putting in order in place), for the tests that compare the two.
	reference bool
}

// refObject is an object of out whose members are out of order: its text
// out[start:end] ('{' to '}'), and its members in order,
// ordered[first:last].
type refObject struct {
	start, end  int
	first, last int
}

// refSpan is a range of a byte slice.
type refSpan struct{ start, end int }

// refMember is one object member: its decoded key in keys and its canonical
// text ("key":value) in out.
type refMember struct {
	keyStart, keyEnd int
	start, end       int
	plain            bool // the key is a plain name (isPlainName)
}

// refJSONError reports where and why a text is not JSON, or is ambiguous.
type refJSONError struct {
	offset    int
	msg       string
	ambiguous bool
}

func (e *refJSONError) Error() string {
	what := "invalid"
	if e.ambiguous {
		what = "ambiguous"
	}
	return "idemhttp: " + what + " JSON at byte " + strconv.Itoa(e.offset) + ": " + e.msg
}

func (c *refCanonicalizer) fail(msg string) error {
	return &refJSONError{offset: c.pos, msg: msg}
}

// begin readies c to canonicalise src, appending to out.
func (c *refCanonicalizer) begin(src, out []byte) {
	c.src, c.pos, c.depth, c.out = src, 0, 0, out
	c.keys, c.mem = c.keys[:0], c.mem[:0]
	c.unsorted, c.ordered = c.unsorted[:0], c.ordered[:0]
	c.moved = 0
	c.lastInPlace = -1
}

func (c *refCanonicalizer) canonical() ([]byte, error) {
	base := len(c.out)
	c.skipSpace()
	if c.pos == len(c.src) {
		return nil, c.fail("no value")
	}
	if err := c.value(); err != nil {
		return nil, err
	}
	c.skipSpace()
	if c.pos != len(c.src) {
		return nil, c.fail("data after the value")
	}
	if len(c.unsorted) > 0 {
		// Recorded as they closed (inner first): order them by position.
		slices.SortFunc(c.unsorted, func(a, b refObject) int { return cmp.Compare(a.start, b.start) })
		c.tmp = c.emit(c.tmp[:0], base, len(c.out))
		c.moved += len(c.tmp)
		c.out = append(c.out[:base], c.tmp...)
	}
	return c.out, nil
}

// emit appends out[lo:hi] to dst with the members of every object out of
// order in it put in order.
func (c *refCanonicalizer) emit(dst []byte, lo, hi int) []byte {
	for {
		i, _ := slices.BinarySearchFunc(c.unsorted, lo, func(o refObject, pos int) int { return cmp.Compare(o.start, pos) })
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

func (c *refCanonicalizer) skipSpace() {
	for c.pos < len(c.src) {
		switch c.src[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// value parses one value at c.pos (whitespace already skipped).
func (c *refCanonicalizer) value() error {
	if c.pos >= len(c.src) {
		return c.fail("unexpected end")
	}
	switch ch := c.src[c.pos]; {
	case ch == '{':
		return c.refObject()
	case ch == '[':
		return c.array()
	case ch == '"':
		return c.str(false)
	case ch == '-' || '0' <= ch && ch <= '9':
		return c.number()
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	}
	return c.fail("unexpected character " + strconv.QuoteRuneToASCII(rune(c.src[c.pos])))
}

func (c *refCanonicalizer) literal(lit string) error {
	if len(c.src)-c.pos < len(lit) || string(c.src[c.pos:c.pos+len(lit)]) != lit {
		return c.fail("invalid literal")
	}
	c.pos += len(lit)
	c.out = append(c.out, lit...)
	return nil
}

func (c *refCanonicalizer) number() error {
	start := c.pos
	src := c.src
	i := c.pos
	if src[i] == '-' {
		i++
	}
	switch {
	case i < len(src) && src[i] == '0':
		i++
	case i < len(src) && '1' <= src[i] && src[i] <= '9':
		for i < len(src) && '0' <= src[i] && src[i] <= '9' {
			i++
		}
	default:
		c.pos = i
		return c.fail("invalid number")
	}
	if i < len(src) && src[i] == '.' {
		i++
		d := i
		for i < len(src) && '0' <= src[i] && src[i] <= '9' {
			i++
		}
		if i == d {
			c.pos = i
			return c.fail("invalid number: no digit after '.'")
		}
	}
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		i++
		if i < len(src) && (src[i] == '+' || src[i] == '-') {
			i++
		}
		d := i
		for i < len(src) && '0' <= src[i] && src[i] <= '9' {
			i++
		}
		if i == d {
			c.pos = i
			return c.fail("invalid number: no digit in the exponent")
		}
	}
	c.pos = i
	c.out = append(c.out, src[start:i]...)
	return nil
}

func (c *refCanonicalizer) enter() error {
	c.depth++
	if c.depth > refMaxJSONDepth {
		return c.fail("nested too deep")
	}
	return nil
}

func (c *refCanonicalizer) array() error {
	if err := c.enter(); err != nil {
		return err
	}
	c.pos++ // '['
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		c.depth--
		return nil
	}
	for {
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.fail("unexpected end in an array")
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			c.depth--
			return nil
		default:
			return c.fail("expected ',' or ']' in an array")
		}
	}
}

func (c *refCanonicalizer) refObject() error {
	if err := c.enter(); err != nil {
		return err
	}
	objStart := c.pos
	c.pos++ // '{'
	open := len(c.out)
	c.out = append(c.out, '{')
	memBase, keyBase := len(c.mem), len(c.keys)
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return nil
	}
	sorted := true
	for {
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != '"' {
			return c.fail("expected a string key in an object")
		}
		m := refMember{keyStart: len(c.keys), start: len(c.out)}
		if err := c.str(true); err != nil {
			return err
		}
		m.keyEnd = len(c.keys)
		m.plain = refIsPlainName(c.keys[m.keyStart:m.keyEnd])
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != ':' {
			return c.fail("expected ':' after an object key")
		}
		c.pos++
		c.out = append(c.out, ':')
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		m.end = len(c.out)
		if n := len(c.mem); n > memBase {
			prev := c.mem[n-1]
			if bytes.Compare(c.keys[prev.keyStart:prev.keyEnd], c.keys[m.keyStart:m.keyEnd]) > 0 {
				sorted = false
			}
		}
		c.mem = append(c.mem, m)
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.fail("unexpected end in an object")
		}
		if c.src[c.pos] == ',' {
			c.pos++
			c.out = append(c.out, ',')
			continue
		}
		if c.src[c.pos] == '}' {
			c.pos++
			c.out = append(c.out, '}')
			break
		}
		return c.fail("expected ',' or '}' in an object")
	}
	if len(c.mem)-memBase > 1 && c.ambiguous(c.mem[memBase:]) {
		return &refJSONError{offset: objStart, ambiguous: true, msg: "two members of an object have the same member name " +
			"(exactly, or as encoding/json matches names: case-insensitively, or as the same integer)"}
	}
	if !sorted {
		members := c.mem[memBase:]
		keys := c.keys
		// No two names are equal (the object is not ambiguous).
		if len(members) <= 12 {
			// Insertion sort, shifting rather than swapping.
			for i := 1; i < len(members); i++ {
				m := members[i]
				key := keys[m.keyStart:m.keyEnd]
				j := i
				for ; j > 0 && bytes.Compare(keys[members[j-1].keyStart:members[j-1].keyEnd], key) > 0; j-- {
					members[j] = members[j-1]
				}
				members[j] = m
			}
		} else {
			slices.SortFunc(members, func(a, b refMember) int {
				return bytes.Compare(keys[a.keyStart:a.keyEnd], keys[b.keyStart:b.keyEnd])
			})
		}
		// An object with nothing put in order inside it is put in order
		// at once, in place: its text is final but for the order of its
		// members. One with something inside put in order (in place, or
		// left for the end) is left for the end, so that no byte moves
		// in place twice.
		if !c.reference && c.lastInPlace < open && (len(c.unsorted) == 0 || c.unsorted[len(c.unsorted)-1].start < open) {
			tmp := c.tmp[:0]
			for k, m := range members {
				if k > 0 {
					tmp = append(tmp, ',')
				}
				tmp = append(tmp, c.out[m.start:m.end]...)
			}
			copy(c.out[open+1:], tmp)
			c.tmp = tmp
			c.moved += len(tmp)
			c.lastInPlace = open
			c.mem = c.mem[:memBase]
			c.keys = c.keys[:keyBase]
			c.depth--
			return nil
		}
		first := len(c.ordered)
		for _, m := range members {
			c.ordered = append(c.ordered, refSpan{m.start, m.end})
		}
		c.unsorted = append(c.unsorted, refObject{start: open, end: len(c.out), first: first, last: len(c.ordered)})
	}
	c.mem = c.mem[:memBase]
	c.keys = c.keys[:keyBase]
	c.depth--
	return nil
}

// ambiguous reports whether two of an object's members have names that
// encoding/json can take for the same (see CanonicalJSON).
func (c *refCanonicalizer) ambiguous(members []refMember) bool {
	if len(members) <= 8 && !c.reference {
		// Few members: compare each pair, most at a glance (names of
		// ASCII letters and such fold to names of their own length).
		for i := 1; i < len(members); i++ {
			a := members[i]
			for _, b := range members[:i] {
				if c.sameName(c.keys[a.keyStart:a.keyEnd], c.keys[b.keyStart:b.keyEnd], a.plain && b.plain) {
					return true
				}
			}
		}
		return false
	}
	fold, spans := c.fold[:0], c.spans[:0]
	for _, m := range members {
		start := len(fold)
		fold = refAppendFoldedName(fold, c.keys[m.keyStart:m.keyEnd])
		spans = append(spans, refSpan{start, len(fold)})
	}
	c.fold, c.spans = fold, spans
	if len(spans) == 2 {
		return bytes.Equal(fold[spans[0].start:spans[0].end], fold[spans[1].start:spans[1].end])
	}
	slices.SortFunc(spans, func(a, b refSpan) int {
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
func (c *refCanonicalizer) sameName(a, b []byte, plain bool) bool {
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
	fold := refAppendFoldedName(c.fold[:0], a)
	n := len(fold)
	fold = refAppendFoldedName(fold, b)
	c.fold = fold
	return bytes.Equal(fold[:n], fold[n:])
}

// refIsPlainName reports whether a decoded member name is all ASCII and no
// integer: its folded form is its own bytes with letters in upper case.
func refIsPlainName(name []byte) bool {
	for _, ch := range name {
		if ch >= utf8.RuneSelf {
			return false
		}
	}
	_, _, integer := refIntegerName(name)
	return !integer
}

// refAppendFoldedName appends the form of a decoded member name (as the
// canonicalizer keeps it: UTF-8, with surrogates in generalised UTF-8)
// that is equal for two names exactly when encoding/json may take them for
// the same name: an integer ([+-]?[0-9]+) as its value (sign, then digits
// without leading zeros; 0 unsigned); any other name with each unpaired
// surrogate as U+FFFD, ASCII letters in upper case and every other
// character as the smallest character of its Unicode simple-folding orbit
// (encoding/json's foldName). No other name folds to an integer's form:
// digits and signs fold only to themselves.
func refAppendFoldedName(b, name []byte) []byte {
	if digits, neg, ok := refIntegerName(name); ok {
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
		b = utf8.AppendRune(b, refFoldRune(r))
		i += size
	}
	return b
}

// refIntegerName reports whether name is an integer as strconv.ParseInt and
// ParseUint read a map key (base 10: an optional sign, then digits), and
// returns its digits without leading zeros and whether it is negative
// (never for zero).
func refIntegerName(name []byte) (digits []byte, neg, ok bool) {
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

// refFoldRune returns the smallest rune of r's simple-folding orbit, as
// encoding/json does.
func refFoldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// str parses a string at c.pos and appends its canonical form to out; with
// key it also appends the decoded string to keys (an unpaired surrogate as
// its three-byte generalised UTF-8 form, so that keys order by code point).
func (c *refCanonicalizer) str(key bool) error {
	src := c.src
	i := c.pos + 1
	c.out = append(c.out, '"')
	for {
		// Copy a run of characters that need no escaping, eight bytes at
		// a time while no byte is below 0x20, '"', '\\' or above 0x7F.
		start := i
		for i+8 <= len(src) {
			v := binary.LittleEndian.Uint64(src[i:])
			const ones, highs = 0x0101010101010101, 0x8080808080808080
			q, bs := v^(ones*'"'), v^(ones*'\\')
			if ((v-ones*0x20)&^v|(q-ones)&^q|(bs-ones)&^bs|v)&highs != 0 {
				break
			}
			i += 8
		}
		for i < len(src) {
			ch := src[i]
			if ch < 0x20 || ch == '"' || ch == '\\' || ch >= utf8.RuneSelf {
				break
			}
			i++
		}
		if i > start {
			c.out = append(c.out, src[start:i]...)
			if key {
				c.keys = append(c.keys, src[start:i]...)
			}
		}
		if i >= len(src) {
			c.pos = i
			return c.fail("unterminated string")
		}
		switch ch := src[i]; {
		case ch == '"':
			c.out = append(c.out, '"')
			c.pos = i + 1
			return nil
		case ch < 0x20:
			c.pos = i
			return c.fail("control character in a string")
		case ch >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(src[i:])
			if r == utf8.RuneError && size <= 1 {
				c.pos = i
				return c.fail("invalid UTF-8 in a string")
			}
			c.out = append(c.out, src[i:i+size]...)
			if key {
				c.keys = append(c.keys, src[i:i+size]...)
			}
			i += size
		default: // '\\'
			if i+1 >= len(src) {
				c.pos = i
				return c.fail("unterminated escape")
			}
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
				u, ok := refHex4(src, i+2)
				if !ok {
					c.pos = i
					return c.fail(`invalid \u escape`)
				}
				i += 6
				r = rune(u)
				if refUTF16IsHigh(r) {
					if lo, ok := refHex4(src, i+2); ok && i+1 < len(src) && src[i] == '\\' && src[i+1] == 'u' && refUTF16IsLow(rune(lo)) {
						r = 0x10000 + (r-0xD800)<<10 + (rune(lo) - 0xDC00)
						i += 6
					}
				}
			default:
				c.pos = i
				return c.fail("invalid escape")
			}
			c.out = refAppendCanonicalRune(c.out, r)
			if key {
				c.keys = refAppendGeneralisedUTF8(c.keys, r)
			}
		}
	}
}

func refUTF16IsHigh(r rune) bool { return 0xD800 <= r && r <= 0xDBFF }
func refUTF16IsLow(r rune) bool  { return 0xDC00 <= r && r <= 0xDFFF }

// refHex4 reads four hex digits at src[i:].
func refHex4(src []byte, i int) (uint16, bool) {
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

const refLowerHex = "0123456789abcdef"

// refAppendCanonicalRune appends r as it appears inside a canonical string.
func refAppendCanonicalRune(b []byte, r rune) []byte {
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
	case r < 0x20 || refUTF16IsHigh(r) || refUTF16IsLow(r):
		return append(b, '\\', 'u', refLowerHex[r>>12&0xF], refLowerHex[r>>8&0xF], refLowerHex[r>>4&0xF], refLowerHex[r&0xF])
	}
	return utf8.AppendRune(b, r)
}

// refAppendGeneralisedUTF8 appends r in UTF-8, encoding a surrogate code
// point as three bytes like any other in its range (which UTF-8 proper
// forbids), so that byte order stays code point order.
func refAppendGeneralisedUTF8(b []byte, r rune) []byte {
	if refUTF16IsHigh(r) || refUTF16IsLow(r) {
		return append(b, byte(0xE0|r>>12), byte(0x80|(r>>6)&0x3F), byte(0x80|r&0x3F))
	}
	return utf8.AppendRune(b, r)
}
