package probe_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/cmd/internal/probe"
)

func TestPathCount(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		path, doc string
		want      int64
		err       string
	}{
		{"count", `{"count": 3}`, 3, ""},
		{"data.total", `{"data": {"total": 12}}`, 12, ""},
		{"orders.#", `{"orders": [{"a":1}, {}, []]}`, 3, ""},
		{"orders.#", `{"orders": []}`, 0, ""},
		{"#", `[1, 2]`, 2, ""},
		{"data.#", `{"data": {"a": 1, "b": 2}}`, 2, ""},
		{"items.1.qty", `{"items": [{"qty": 1}, {"qty": 7}]}`, 7, ""},
		{"2", `{"2": 5}`, 5, ""},
		{"count", `{"count": -4}`, -4, ""},
		{"count", `{"count": 3.5}`, 0, "not an integer"},
		{"count", `{"count": "3"}`, 0, "a string"},
		{"orders", `{"orders": []}`, 0, "orders.#"},
		{"total", `{"count": 1}`, 0, `no member "total"`},
		{"count.#", `{"count": 1}`, 0, "not an array"},
		{"items.5", `{"items": [1]}`, 0, "no index 5"},
		{"items.x", `{"items": [1]}`, 0, "not an index"},
		{"count", `{"count": 1} {}`, 0, "more than one"},
		{"count", `<html>`, 0, "not JSON"},
	} {
		p, err := probe.ParsePath(c.path)
		if err != nil {
			t.Fatalf("ParsePath(%q): %v", c.path, err)
		}
		got, err := p.Count([]byte(c.doc))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s in %s: %d, %v; want an error saying %q", c.path, c.doc, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s in %s: %d, %v; want %d", c.path, c.doc, got, err, c.want)
		}
	}
	for _, bad := range []string{"", ".", "a.", ".a", "a..b", "#.a", "a.#.b"} {
		if _, err := probe.ParsePath(bad); err == nil {
			t.Errorf("ParsePath(%q) took it", bad)
		}
	}
}

func FuzzPath(f *testing.F) {
	f.Add("orders.#", `{"orders":[1,2]}`)
	f.Add("a.0.b", `{"a":[{"b":1}]}`)
	f.Fuzz(func(t *testing.T, path, doc string) {
		p, err := probe.ParsePath(path)
		if err != nil {
			return
		}
		_, _ = p.Count([]byte(doc))
		if p.String() != path {
			t.Errorf("String %q, parsed %q", p.String(), path)
		}
	})
}
