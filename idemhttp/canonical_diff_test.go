package idemhttp

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// canonicalSeeds are inputs for the canonicalizer's fuzz targets: the
// seeds of FuzzCanonicalJSON and FuzzCanonicalShortcuts, dense bodies
// (many small members, in order and not), and escapes, surrogates,
// invalid UTF-8, deep nesting, huge numbers and duplicate or confusable
// names, each also cut short.
func canonicalSeeds() []string {
	seeds := []string{
		// FuzzCanonicalJSON.
		`{"b":1,"a":[true,false,null,{"y":"\u00e9","x":-1.5e10}]}`, `{"a":[true,false,null,{"x":-1.5e10,"y":"é"}],"b":1}`,
		`"\ud800\udc00\ud800"`, `"𐀀\ud800"`, `[]`, `{}`, `0`, `-0`, `{"a":1,"a":2}`, `{"a":2,"a":1}`,
		`{"\u0000":0,"":1}`, `{"":1,"\u0000":0}`, "\"\u2028\"", `"\u2028"`, `[[[[]]]]`, `[[[[ ]]]]`,
		`{"a":{"b":{"c":{}}}}`, `{"quantity":1,"Quantity":1000}`, `{"Quantity":1000,"quantity":1}`,
		`{"q":{"k":1,"\u212a":2}}`, `{"q":{"\u212a":2,"k":1}}`, "{\"s\":1,\"\u017f\":2}", "{\"\u017f\":2,\"s\":1}",
		`{"\ud800":1,"\udbff":2}`, `{"\udbff":2,"\ud800":1}`, `{"1":1,"01":2}`, `{"01":2,"1":1}`,
		// FuzzCanonicalShortcuts.
		`{"b":1,"a":2}`,
		`[{"b":1,"a":{"d":1,"c":2}},{"y":[{"q":1,"p":2}],"x":0}]`,
		`{"z":{"b":1,"a":2},"y":{"d":{"f":1,"e":2},"c":3},"x":[{"h":1,"g":2}]}`,
		`{"b":0,"k":1,"\u212a":2}`, `{"+1":1,"1":2}`, `{"-0":1,"0":2}`, `{"":1,"a":2,"":3}`,
		`{"a1":1,"A1":2}`, `{"1a":1,"1A":2}`, `{"\ud800":1,"\udbff":2,"\ufffd":3}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"A":10}`,
		`{"j":1,"i":2,"h":3,"g":4,"f":5,"e":6,"d":7,"c":8,"b":9,"a":10,"m":11,"l":12,"k":13,"n":14}`,
		`{"b":{"b":{"b":1,"a":2},"a":2},"a":{"b":1,"a":{"b":1,"a":2}}}`,
		// Escapes, surrogates, invalid UTF-8.
		`"\u0041\u00e9\/\"\\\b\f\n\r\t\u0001\u001F"`, `"\ud83d\ude00"`, `"\uD800x"`, `"\udc00\ud800"`,
		`"\uDBFF\uDFFF"`, `"\ud800\u0041"`, `"\ud800\\u0041"`, `"\ud800\"`, `"\ud800\u"`, `"\ud800\udc0"`,
		`{"\ud800\udc00":1,"\ufffd":2,"\uffff":3,"\ue000":4}`, `{"a\"":1,"a":2,"a\u0000":3}`,
		"\"\u2028\x7f\"", "\"\xff\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "\"\xe2\x82\"", "\"\xf4\x90\x80\x80\"",
		"{\"\xff\":1}", "{\"a\xc3\":1}", "\"a\x01\"", "\"\x1f\"", `"\x"`, `"\u12"`, `"\u12g4"`, `"abc`, `"\`,
		`{"key\u0020with\tescape":"va\\lue\n","k\u00e9y":"é","\/":"/"}`,
		`"0123456789abcdef\"0123456789"`, `"0123456\\789abcdefé0123"`,
		// Numbers.
		`[1.0, 1e0, -0, 1E+2, 0.5e-3]`, `-`, `-a`, `01`, `1.`, `.5`, `1e`, `1e+`, `+1`, `-01`, `1.e5`, `1E-0`,
		strings.Repeat("9", 400), "-" + strings.Repeat("1", 300) + "." + strings.Repeat("0", 300) + "e-" + strings.Repeat("9", 50),
		`[0,-0,0.0,-0.0e0,123456789012345678901234567890]`, `{"n":1e400,"m":-1e-400}`, `[1 2]`, `[1,]`,
		// Literals and structure.
		`null`, ` true `, `false`, `tru`, `nul`, `fals`, `truex`, `nulll`, ``, ` `, `{`, `[`, `{"a"}`, `{"a":1,}`,
		`{} {}`, `{a:1}`, `'a'`, `NaN`, `{"a" 1}`, `{"a":1 "b":2}`, `[1}`, `{"a":1]`, " {\n\t\"b\" : [ 1 , 2 ] ,\r\n \"a\" : { } } ",
		"\t[\r\n1\n,\t2 ]\n", `{"a":[],"b":{},"c":[{}],"d":[[]]}`,
		// Duplicate and confusable names.
		`{"b":1,"a":1,"b":0}`, `{"a":{"d":1},"A":true}`, `[{"x":{"k":1,"\u212a":2}}]`, `{"1":0,"01":1}`,
		`{"sku":1,"SKU":2}`, `{"sKu":1,"qty":2,"Sku":3}`, `{"a":1,"\u0061":2}`, `{"é":1,"\u00e9":2}`, `{"é":1,"É":2}`,
		`{"\ud800":1,"\ufffd":2}`, `{"\ud800":1,"\udc00":2}`, `{"":1,"":2}`, `{"-1":1,"-01":2}`, `{"+0":1,"-0":2}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"B":9}`, `{"i":1,"h":2,"g":3,"f":4,"e":5,"d":6,"c":7,"b":8,"a":9,"I":10}`,
		`{"é":1,"z":2,"😀":3,"\uffff":4}`, `{"b\u0000":1,"b":2}`, `{"ab":1,"a":2,"abc":3,"a\u007f":4}`,
	}
	// Deep nesting.
	seeds = append(seeds,
		strings.Repeat("[", 10000)+strings.Repeat("]", 10000),
		strings.Repeat("[", 10001)+strings.Repeat("]", 10001),
		strings.Repeat(`{"a":`, 10000)+"1"+strings.Repeat("}", 10000),
		strings.Repeat(`{"b":`, 200)+`"`+strings.Repeat("x", 1000)+`"`+strings.Repeat(`,"a":0}`, 200),
		strings.Repeat(`{"b":[{"d":1,"c":`, 50)+"0"+strings.Repeat(`}],"a":2}`, 50),
	)
	// Dense bodies: BenchmarkOverhead's 1 KiB body, and in order.
	var unsorted, dense strings.Builder
	unsorted.WriteString(`{"order":"A-1","lines":[`)
	dense.WriteString(`{"lines":[`)
	for i := range 18 {
		if i > 0 {
			unsorted.WriteByte(',')
			dense.WriteByte(',')
		}
		fmt.Fprintf(&unsorted, `{"sku":"SKU-%02d","qty":%d,"price":%d,"note":"x"}`, i, i%5+1, 100+i)
		fmt.Fprintf(&dense, `{"note":"x","price":%d,"qty":%d,"sku":"SKU-%02d"}`, 100+i, i%5+1, i)
	}
	unsorted.WriteString(`],"memo":"` + strings.Repeat("m", 400) + `"}`)
	dense.WriteString(`],"memo":"` + strings.Repeat("m", 400) + `","order":"A-1"}`)
	seeds = append(seeds, unsorted.String(), dense.String(),
		`{"sku":"A-1","quantity":2,"customer":{"id":42,"name":"Ada Lovelace","email":"ada@example.com"},"tags":["gift","express"],"note":"nnnn"}`,
		`[{"a":1,"b":true,"c":null,"d":"x"},{"a":-1.5e3,"b":false,"c":[],"d":""}]`,
		`{ "a" : 1 , "b" : [ "x" , "y" ] , "c" : { "d" : null } }`,
	)
	n := len(seeds)
	for _, s := range seeds[:n] {
		if len(s) > 2 && len(s) < 200 {
			seeds = append(seeds, s[:len(s)/2], s[:len(s)-1])
		}
	}
	return seeds
}

// FuzzCanonicalMatchesReference: CanonicalJSON, tuned for speed, gives
// the canonical form and the errors of the canonicalizer as it was
// (refCanonicalizer), byte for byte, whatever dst holds (src itself
// included) and whatever the pooled state ran before; the canonical form
// is hashed into stored fingerprints.
func FuzzCanonicalMatchesReference(f *testing.F) {
	for _, s := range canonicalSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		const prefix = "dst:"
		want, wantErr := refCanonicalJSON([]byte(prefix), src)

		check := func(how string, got []byte, err error) {
			t.Helper()
			if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
				t.Fatalf("%s: %q: error %v, reference %v", how, src, err, wantErr)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: %q: %q, reference %q", how, src, got, want)
			}
		}
		// A fresh dst, and one whose spare capacity holds garbage.
		got, err := CanonicalJSON([]byte(prefix), src)
		check("new dst", got, err)
		dirty := bytes.Repeat([]byte{'}'}, len(prefix)+2*len(src)+16)
		copy(dirty, prefix)
		got, err = CanonicalJSON(dirty[:len(prefix)], src)
		check("dirty dst", got, err)
		// In place: src is dst's spare capacity, as in
		// CanonicalJSON(buf[:0], buf).
		inPlace := append([]byte(prefix), src...)
		got, err = CanonicalJSON(inPlace[:len(prefix)], inPlace[len(prefix):])
		check("in place", got, err)

		// A canonicalizer whose scratch holds another run's leftovers.
		var c canonicalizer
		c.begin([]byte(`{"z":{"y":"\u00e9\ud800","x":[{"b":1,"a":2}]},"K":1,"k\u00e9":2}`), nil)
		if _, err := c.canonical(); err != nil {
			t.Fatal(err)
		}
		c.begin(src, []byte(prefix))
		got, err = c.canonical()
		if err != nil {
			got = []byte(prefix)
		}
		check("reused", got, err)
		if c.moved > 2*len(src) {
			t.Fatalf("%q: %d bytes copied to put members in order", src, c.moved)
		}
	})
}
