// Package metricstest reads a Prometheus text exposition in tests: the
// tests of idemprom and of the programs that serve /metrics scrape the
// real handler over HTTP with it. It imports the standard library only.
package metricstest

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Scrape GETs url and returns its samples (series, as written, → value)
// and the raw text. A failed request, a status other than 200 or a
// sample that does not parse fails t.
func Scrape(t testing.TB, url string) (map[string]float64, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d %v", url, resp.StatusCode, err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("scrape %s: line %q: %v", url, line, err)
		}
		out[line[:i]] = v
	}
	return out, string(raw)
}
