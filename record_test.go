package idem_test

import (
	"reflect"
	"testing"

	"github.com/idemkit/idem"
)

// Clone copies everything and shares no memory: changing the original
// after Clone leaves the copy as it was; nil and empty keep their form.
func TestResponseClone(t *testing.T) {
	orig := idem.Response{
		StatusCode:  201,
		Header:      map[string][]string{"Location": {"/o/1"}, "Vary": {"A", "B"}, "Empty": {}, "Nil": nil},
		Body:        []byte("created"),
		BodyOmitted: true,
	}
	want := idem.Response{
		StatusCode:  201,
		Header:      map[string][]string{"Location": {"/o/1"}, "Vary": {"A", "B"}, "Empty": {}, "Nil": nil},
		Body:        []byte("created"),
		BodyOmitted: true,
	}
	c := orig.Clone()
	orig.Body[0] = 'X'
	orig.Header["Vary"][1] = "changed"
	orig.Header["New"] = []string{"x"}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("Clone = %#v, want %#v", c, want)
	}
	if c.Header["Empty"] == nil || c.Header["Nil"] != nil {
		t.Fatalf("Clone changed the form of empty and nil values: %#v", c.Header)
	}
	// Appending to one header's values must not reach another's.
	c.Header["Location"] = append(c.Header["Location"], "/o/2")
	if got := c.Header["Vary"]; !reflect.DeepEqual(got, []string{"A", "B"}) {
		t.Fatalf("an append to one header's values changed another: %q", got)
	}
	for _, r := range []idem.Response{{}, {Body: []byte{}, Header: map[string][]string{}}} {
		c := r.Clone()
		if (c.Body == nil) != (r.Body == nil) || (c.Header == nil) != (r.Header == nil) {
			t.Fatalf("Clone(%#v) = %#v: nil and empty must keep their form", r, c)
		}
	}
}
