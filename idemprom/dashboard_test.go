package idemprom_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemprom"
	"github.com/prometheus/client_golang/prometheus"
)

// exported returns the names of the series the Observer exports: each
// metric's name, and for a histogram its _bucket, _sum and _count.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	obs, err := idemprom.New(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc, 64)
	go func() { obs.Describe(ch); close(ch) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("desc %s has no name", d)
		}
		names[m[1]] = true
		if strings.HasSuffix(m[1], "_seconds") && strings.Contains(m[1], "duration") {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+s] = true
			}
		}
	}
	if len(names) < 13 {
		t.Fatalf("only %d names described: %v", len(names), names)
	}
	return names
}

// promqlKeywords are the words of PromQL that are not metric names.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true,
	// aggregations, which may be followed by by (...) before their (
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
}

// metricNames returns the metric names an expression selects, after
// checking that its brackets balance. It lexes the expression: string
// literals, label matchers ({...}), ranges ([...]), the label lists of
// by/without/on/ignoring, numbers and function calls are not names.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	var names []string
	var stack []byte
	grouping := false // inside the parentheses of by (...) and its kin
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				t.Fatalf("%q: unterminated string", expr)
			}
			i = j + 1
		case c == '(' || c == '{' || c == '[':
			stack = append(stack, c)
			i++
		case c == ')' || c == '}' || c == ']':
			open := map[byte]byte{')': '(', '}': '{', ']': '['}[c]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				t.Fatalf("%q: unbalanced %c at %d", expr, c, i)
			}
			stack = stack[:len(stack)-1]
			if c == ')' {
				grouping = false
			}
			i++
		case c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			j := i
			for j < len(expr) && (expr[j] == '_' || expr[j] == ':' || 'a' <= expr[j] && expr[j] <= 'z' || 'A' <= expr[j] && expr[j] <= 'Z' || '0' <= expr[j] && expr[j] <= '9') {
				j++
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && expr[k] == ' ' {
				k++
			}
			inside := len(stack) > 0 && (stack[len(stack)-1] == '{' || stack[len(stack)-1] == '[')
			switch {
			case inside, grouping, strings.HasPrefix(word, "$"):
			case promqlKeywords[strings.ToLower(word)]:
				if w := strings.ToLower(word); w == "by" || w == "without" || w == "on" || w == "ignoring" {
					grouping = true
				}
			case k < len(expr) && expr[k] == '(':
				// a function or an aggregation
			default:
				names = append(names, word)
			}
			i = j
		case '0' <= c && c <= '9' || c == '.': // a number or a duration (5m)
			j := i
			for j < len(expr) && (expr[j] == '.' || '0' <= expr[j] && expr[j] <= '9' || 'a' <= expr[j] && expr[j] <= 'z') {
				j++
			}
			i = j
		case c == '$': // a dashboard variable ($__rate_interval)
			j := i + 1
			for j < len(expr) && (expr[j] == '_' || 'a' <= expr[j] && expr[j] <= 'z' || '0' <= expr[j] && expr[j] <= '9') {
				j++
			}
			i = j
		default:
			i++
		}
	}
	if len(stack) != 0 {
		t.Fatalf("%q: unclosed %c", expr, stack[len(stack)-1])
	}
	return names
}

// TestDashboardMetricsExist: every PromQL expression of the Grafana
// dashboard (panel targets and the route variable's query) selects only
// metrics the Observer exports, and every metric family the Observer
// exports is on some panel.
func TestDashboardMetricsExist(t *testing.T) {
	raw, err := os.ReadFile("../docs/grafana/idem-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	used := map[string]bool{}
	exprs := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			found := metricNames(t, tg.Expr)
			if len(found) == 0 {
				t.Errorf("panel %q: %q selects no metric", p.Title, tg.Expr)
			}
			for _, n := range found {
				if !names[n] {
					t.Errorf("panel %q: %q uses %s, which the Observer does not export", p.Title, tg.Expr, n)
				}
				used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
			}
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		q, ok := v.Query.(map[string]any)
		if !ok {
			continue
		}
		s, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil || !names[m[1]] {
			t.Errorf("variable %s: query %q is not label_values of an exported metric", v.Name, s)
		}
	}
	for n := range names {
		if strings.HasSuffix(n, "_bucket") || strings.HasSuffix(n, "_sum") || strings.HasSuffix(n, "_count") {
			continue
		}
		if !used[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
	if exprs < 9 {
		t.Errorf("%d expressions", exprs)
	}
}

// TestMetricNamesLexer: the lexer finds names, and only names.
func TestMetricNamesLexer(t *testing.T) {
	got := metricNames(t, `histogram_quantile(0.99, sum by (le, store) (rate(a_bucket{x="b_c",y=~"$route"}[$__rate_interval]))) / on (route) b_total offset 5m`)
	if strings.Join(got, ",") != "a_bucket,b_total" {
		t.Fatalf("names %v", got)
	}
}
