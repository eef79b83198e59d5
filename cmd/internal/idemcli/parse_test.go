package idemcli

import (
	"errors"
	"path"
	"strings"
	"testing"
)

// FuzzParseHeaders: a 'Name: value' flag is accepted exactly when it has a
// colon and its name is an HTTP token (a value no request can carry is
// the probe's to refuse, naming the flag: TestProbeMoreUsageErrors); what
// is accepted is the name and the trimmed value, in order, and what is
// refused is a usage error.
func FuzzParseHeaders(f *testing.F) {
	for _, s := range [][2]string{{"X-Api-Key: k1", "Accept:application/json"}, {"X: a: b", " X :  "},
		{"X: a", "X"}, {"X Y: 1", ": v"}, {"X:v", "X:\tv\t"}, {"Ünï: v", "X: v"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		h, err := parseHeaders("-H", []string{a, b})
		want := true
		var names, values []string
		for _, v := range []string{a, b} {
			name, value, ok := strings.Cut(v, ":")
			name, value = strings.TrimSpace(name), strings.TrimSpace(value)
			want = want && ok && validHeaderName(name)
			names, values = append(names, name), append(values, value)
		}
		if (err == nil) != want {
			t.Fatalf("parseHeaders(%q, %q) = %q, %v; want accepted: %v", a, b, h, err, want)
		}
		if err != nil {
			var u *usageError
			if !errors.As(err, &u) {
				t.Fatalf("error %v is not a usage error", err)
			}
			return
		}
		for i, name := range names {
			got := h.Values(name)
			if names[0] == names[1] || strings.EqualFold(names[0], names[1]) {
				got = got[i:]
			}
			if len(got) == 0 || got[0] != values[i] {
				t.Fatalf("parseHeaders(%q, %q) = %q; want %s: %q", a, b, h, name, values[i])
			}
		}
	})
}

// FuzzParseRoutes: -routes is accepted exactly when each non-empty item
// is an upper-case method token, a space and a valid path pattern that
// starts with '/', and at least one item is given; each accepted route
// keeps them as written, and what is refused is a usage error.
func FuzzParseRoutes(f *testing.F) {
	for _, s := range []string{"POST /orders", "POST /orders, PATCH /orders/*", "post /a", "POST orders", "POST /[",
		",,", "", "POST", "GET  /a/../b ,PUT /x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		routes, err := parseRoutes(raw)
		var items []string
		want := true
		for item := range strings.SplitSeq(raw, ",") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			method, pattern, ok := strings.Cut(item, " ")
			pattern = strings.TrimSpace(pattern)
			_, perr := path.Match(pattern, "/")
			want = want && ok && validHeaderName(method) && method == strings.ToUpper(method) &&
				strings.HasPrefix(pattern, "/") && perr == nil
			items = append(items, method+" "+pattern)
		}
		want = want && len(items) > 0
		if (err == nil) != want {
			t.Fatalf("parseRoutes(%q) = %v, %v; want accepted: %v", raw, routes, err, want)
		}
		if err != nil {
			var u *usageError
			if !errors.As(err, &u) {
				t.Fatalf("error %v is not a usage error", err)
			}
			return
		}
		if len(routes) != len(items) {
			t.Fatalf("parseRoutes(%q) = %d routes, want %d", raw, len(routes), len(items))
		}
		for i, r := range routes {
			if r.method+" "+r.pattern != items[i] || r.folded != foldPath(r.pattern) {
				t.Fatalf("route %d of %q = %+v, want %q", i, raw, r, items[i])
			}
		}
	})
}
