package probe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// A Path selects a count in a JSON document: member names and array
// indexes separated by dots, and an optional last segment # that takes the
// length of the array (or the number of members of the object) it follows.
//
//	count          {"count": 3}                       → 3
//	data.total     {"data": {"total": 3}}             → 3
//	orders.#       {"orders": [{…}, {…}, {…}]}        → 3
//	#              [{…}, {…}, {…}]                    → 3
//	items.0.qty    {"items": [{"qty": 3}]}            → 3
//
// A segment that is all digits indexes an array (and names a member of an
// object). The value selected must be an integer, or the length that #
// takes. Member names holding a dot cannot be selected.
type Path struct {
	raw  string
	segs []string
}

// ParsePath parses a Path. It refuses an empty path, an empty segment
// (a leading, trailing or doubled dot) and a # that is not last.
func ParsePath(s string) (Path, error) {
	if s == "" {
		return Path{}, errors.New("empty path; give a member name such as count, a dotted path such as data.total, or orders.# for the length of an array")
	}
	segs := strings.Split(s, ".")
	for i, seg := range segs {
		switch {
		case seg == "":
			return Path{}, fmt.Errorf("path %q has an empty segment; separate member names with single dots (data.total)", s)
		case seg == "#" && i != len(segs)-1:
			return Path{}, fmt.Errorf("path %q has # before its end; # takes the length of what precedes it and comes last (orders.#)", s)
		}
	}
	return Path{raw: s, segs: segs}, nil
}

// String returns the path as parsed.
func (p Path) String() string { return p.raw }

// Count returns the integer that p selects in the JSON document doc.
func (p Path) Count(doc []byte) (int64, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, fmt.Errorf("the answer is not JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return 0, errors.New("the answer holds more than one JSON value")
	}
	at := "the document"
	for _, seg := range p.segs {
		if seg == "#" {
			switch x := v.(type) {
			case []any:
				return int64(len(x)), nil
			case map[string]any:
				return int64(len(x)), nil
			default:
				return 0, fmt.Errorf("%s is %s, not an array: # takes an array's length", at, kind(v))
			}
		}
		switch x := v.(type) {
		case map[string]any:
			next, ok := x[seg]
			if !ok {
				return 0, fmt.Errorf("%s has no member %q (it has %s)", at, seg, members(x))
			}
			v = next
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 {
				return 0, fmt.Errorf("%s is an array of %d; %q is not an index (to count it, end the path with #)", at, len(x), seg)
			}
			if i >= len(x) {
				return 0, fmt.Errorf("%s is an array of %d; it has no index %d", at, len(x), i)
			}
			v = x[i]
		default:
			return 0, fmt.Errorf("%s is %s; it has no member %q", at, kind(v), seg)
		}
		at = strconv.Quote(seg)
	}
	switch x := v.(type) {
	case json.Number:
		n, err := strconv.ParseInt(x.String(), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s is %s, not an integer", at, x)
		}
		return n, nil
	case []any:
		return 0, fmt.Errorf("%s is an array; end the path with # for its length (%s.#)", at, p.raw)
	default:
		return 0, fmt.Errorf("%s is %s, not an integer", at, kind(v))
	}
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case []any:
		return "an array"
	default:
		return "an object"
	}
}

// members lists up to 5 member names of m, for an error.
func members(m map[string]any) string {
	if len(m) == 0 {
		return "none"
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, strconv.Quote(k))
	}
	// Sorted, so that the error reads the same each time.
	slices.Sort(names)
	if len(names) > 5 {
		names = append(names[:5], "…")
	}
	return strings.Join(names, ", ")
}
