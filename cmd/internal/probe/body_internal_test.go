package probe

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzBodies checks the bodies the probe derives from the one it is
// given: a reordered body is the same JSON object to a decoder (so an API
// that answers it as another request is rightly blamed); every body of
// otherBodies differs from the original to a decoder (so an API that
// replays it is rightly blamed), and a JSON object stays a JSON object.
func FuzzBodies(f *testing.F) {
	for _, s := range []string{`{"sku":"A","quantity":1}`, `{"a":{"b":1,"c":2},"d":[1,2]}`, `[1]`, `"x"`,
		"name=pen&q=1", "", `{"n":9223372036854775807,"s":"x"}`, `{"a":1} `} {
		f.Add([]byte(s), "application/json", "t1")
	}
	f.Fuzz(func(t *testing.T, body []byte, contentType, tag string) {
		if out, ok := reordered(body); ok {
			if !sameJSON(body, out) {
				t.Fatalf("reordered(%q) = %q, which decodes to another value", body, out)
			}
		}
		_, isObject := objectMembers(body)
		for _, other := range otherBodies(body, contentType, tag) {
			if bytes.Equal(other, body) || isJSON(body) && isJSON(other) && sameJSON(body, other) {
				t.Fatalf("otherBodies(%q) holds %q, the same request", body, other)
			}
			if _, ok := objectMembers(other); isObject && !ok {
				t.Fatalf("otherBodies of the object %q holds %q, not an object", body, other)
			}
		}
	})
}

// sameJSON reports whether a and b decode to the same value, into any and
// into a map, as a handler would read them.
func sameJSON(a, b []byte) bool {
	decode := func(b []byte, v any) error {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		return dec.Decode(v)
	}
	var va, vb any
	if decode(a, &va) != nil || decode(b, &vb) != nil || !reflect.DeepEqual(va, vb) {
		return false
	}
	var ma, mb map[string]any
	errA, errB := decode(a, &ma), decode(b, &mb)
	return (errA == nil) == (errB == nil) && reflect.DeepEqual(ma, mb) && reflect.DeepEqual(folded(a), folded(b))
}

// folded is what a struct reads from the top-level object b: for each
// name, case folded as encoding/json matches fields, the last value.
func folded(b []byte) map[string]string {
	ms, ok := objectMembers(b)
	if !ok {
		return nil
	}
	out := map[string]string{}
	for _, m := range ms {
		var name string
		_ = json.Unmarshal(m.name, &name)
		out[strings.ToLower(name)] = string(m.value)
	}
	return out
}
