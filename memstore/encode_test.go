package memstore

import (
	"math"
	"reflect"
	"testing"

	"github.com/idemkit/idem"
)

// TestResponseEncoding: a response comes back from its encoding as it
// was, nil and empty kept apart, and sharing no memory with it.
func TestResponseEncoding(t *testing.T) {
	t.Parallel()
	for _, r := range []idem.Response{
		{},
		{StatusCode: 201, Header: map[string][]string{}, Body: []byte{}},
		{StatusCode: 200, Header: map[string][]string{"Content-Type": {"application/json"}, "X-Nil": nil, "X-Empty": {}, "X-Two": {"a", ""}}, Body: []byte(`{"id":1}`)},
		{StatusCode: 599, BodyOmitted: true, Header: map[string][]string{"": {"\x00\xff"}}},
		{StatusCode: math.MaxInt, Body: make([]byte, 70000)}, // 1<<40 would not build for 32-bit
		{StatusCode: math.MinInt, Header: map[string][]string{}},
		{StatusCode: -1, Body: []byte{0}},
	} {
		b := appendResponse("", &r)
		got, err := decodeResponse(b)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !reflect.DeepEqual(*got, r) {
			t.Fatalf("encoded %+v, decoded %+v", r, *got)
		}
		if len(got.Body) > 0 {
			got.Body[0] ^= 1
			if again, _ := decodeResponse(b); !reflect.DeepEqual(*again, r) {
				t.Fatal("the decoded body shares the stored bytes")
			}
		}
	}
}

// FuzzDecodeResponse: any stored bytes decode to a response or an
// error, never a panic; a response decoded encodes to the same bytes'
// meaning.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(appendResponse("", &idem.Response{StatusCode: 200, Header: map[string][]string{"A": {"b", "c"}, "N": nil}, Body: []byte("x")}))
	f.Add("")
	f.Fuzz(func(t *testing.T, b string) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		again, err := decodeResponse(appendResponse("", r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("%q decoded to %+v, which round-trips to %+v, %v", b, r, again, err)
		}
	})
}
