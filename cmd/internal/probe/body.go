package probe

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"mime"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// isJSON reports whether body is one JSON value.
func isJSON(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return false
	}
	_, err := dec.Token()
	return err == io.EOF
}

// member is one member of a JSON object, its value as written.
type member struct {
	name  json.RawMessage // the name as written, quotes included
	value json.RawMessage
}

// objectMembers returns the members of body, a JSON object, in the order
// written; ok is false when body is not one JSON object.
func objectMembers(body []byte) (ms []member, ok bool) {
	if !isJSON(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if d, isDelim := tok.(json.Delim); err != nil || !isDelim || d != '{' {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		name, _ := json.Marshal(tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		ms = append(ms, member{name: name, value: v})
	}
	return ms, true
}

// encodeObject writes ms as a JSON object, in their order, each value as
// written.
func encodeObject(ms []member) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(m.name)
		b.WriteByte(':')
		b.Write(m.value)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// reordered returns body, a JSON object of two or more members, with its
// members in reverse order (their values as written); ok is false for any
// other body, and for an object with two names a decoder can take for
// one (equal once unescaped, or but for case, as encoding/json matches
// struct fields): the last of them wins, so reversed it is another
// request, which an API rightly does not answer as the first.
func reordered(body []byte) (out []byte, ok bool) {
	ms, ok := objectMembers(body)
	if !ok || len(ms) < 2 {
		return nil, false
	}
	for i := range ms {
		if shadowed(ms, i) {
			return nil, false
		}
	}
	slices.Reverse(ms)
	return encodeObject(ms), true
}

// shadowed reports whether a member after ms[i] has a name a decoder can
// take for its name (equal once unescaped, or but for case, as
// encoding/json matches struct fields): that member's value is the one
// read.
func shadowed(ms []member, i int) bool {
	var name string
	_ = json.Unmarshal(ms[i].name, &name)
	for _, m := range ms[i+1:] {
		var later string
		_ = json.Unmarshal(m.name, &later)
		if strings.EqualFold(name, later) {
			return true
		}
	}
	return false
}

// otherBody returns a body other than body, of the same kind, for the
// mismatch check: a JSON object gains the member "idem_probe"; other JSON
// is replaced by {"idem_probe": tag}; a form (or any other body) gains the
// field idem_probe=tag.
func otherBody(body []byte, contentType, tag string) []byte {
	if ms, ok := objectMembers(body); ok {
		name, _ := json.Marshal("idem_probe")
		value, _ := json.Marshal(tag)
		return encodeObject(append(ms, member{name: name, value: value}))
	}
	if isJSON(body) || isJSONType(contentType) {
		out, _ := json.Marshal(map[string]string{"idem_probe": tag})
		return out
	}
	field := "idem_probe=" + url.QueryEscape(tag)
	if len(body) == 0 {
		return []byte(field)
	}
	return append(append(bytes.Clone(body), '&'), field...)
}

// otherBodies returns the bodies other than body that the mismatch
// checks may send, in the order they are tried: for a JSON object, the
// object with its first integer member plus one, then with its first
// string member with "-idem-probe" appended (of the members no later
// member shadows) (a value the API reads, so
// that a fingerprint of the parsed request, which drops members it does
// not know, differs too); then otherBody. An API that validates its
// payload may refuse a value or a member: the mismatch checks take the
// first of them that the API accepts on its own.
func otherBodies(body []byte, contentType, tag string) [][]byte {
	var out [][]byte
	if ms, ok := objectMembers(body); ok {
		changed := func(i int, value []byte) []byte {
			c := slices.Clone(ms)
			c[i].value = value
			return encodeObject(c)
		}
		for i, m := range ms {
			if shadowed(ms, i) {
				continue // a change there is read by no one
			}
			if n, err := strconv.ParseInt(string(m.value), 10, 64); err == nil && n < math.MaxInt64 {
				out = append(out, changed(i, strconv.AppendInt(nil, n+1, 10)))
				break
			}
		}
		for i, m := range ms {
			var s string
			if !shadowed(ms, i) && json.Unmarshal(m.value, &s) == nil {
				v, _ := json.Marshal(s + "-idem-probe")
				out = append(out, changed(i, v))
				break
			}
		}
	}
	return append(out, otherBody(body, contentType, tag))
}

// isJSONType reports whether a Content-Type is JSON (application/json or
// a +json type).
func isJSONType(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// defaultContentType is the Content-Type the probe sends with a body when
// no -H gives one: application/json for a JSON body, else curl's
// application/x-www-form-urlencoded.
func defaultContentType(body []byte) string {
	if isJSON(body) {
		return "application/json"
	}
	return "application/x-www-form-urlencoded"
}
