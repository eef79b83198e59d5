package idemcli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idem/cmd/internal/probe"
)

// idem probe against idem proxy in front of an API with no idempotency
// at all (the evidence), on every store the proxy runs on: every
// check passes, the effect read through the proxy (GET is not covered)
// moved once per key executed, and the API created exactly that many
// items. The same probe against the API itself fails (TestProbeJSON's
// unguarded case), so the passes are the proxy's.
func TestProbeThroughProxy(t *testing.T) {
	t.Parallel()
	for _, b := range proxyBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			base, created := api(t, true)
			proxy := startProxy(t, append(b.flags(t), "-upstream", base, "-routes", "POST /items")...)
			r := runIdem(t, "", "probe", "-d", `{"name":"pen","qty":2}`, "-d4xx", `{"name":"refuse","qty":1}`,
				"-effect-url", proxy+"/count", "-effect-json-path", "count", "-effect-header", "X-Token: t",
				proxy+"/items")
			if r.code != 0 {
				t.Fatalf("exit %d, stderr %q; stdout:\n%s", r.code, r.stderr, r.stdout)
			}
			// Every check passes but those that need a flag not given
			// (-H2, -d5xx, -retention) or a cookie the API does not set;
			// concurrent-409 may warn and retry-after not apply: whether
			// a duplicate arrives while the first runs is scheduling's.
			warnings := strings.Count(r.stdout, "  warning ")
			na := 4
			if strings.Contains(r.stdout, "  n/a     retry-after ") {
				na++
			}
			noun := "warnings"
			if warnings == 1 {
				noun = "warning"
			}
			want := fmt.Sprintf("PASS: core passed; %d passed, 0 failed, %d %s, %d n/a\n", len(probe.Checks)-warnings-na, warnings, noun, na)
			if !strings.Contains(r.stdout, want) || warnings > 1 || warnings == 1 && !strings.Contains(r.stdout, "  warning concurrent-409 ") {
				t.Fatalf("want %q, at most concurrent-409 warned; stdout:\n%s", want, r.stdout)
			}
			for _, id := range []string{"expiry", "private-headers", "released-5xx", "scoped-keys"} {
				if !strings.Contains(r.stdout, "  n/a     "+id+" ") {
					t.Errorf("%s applies; stdout:\n%s", id, r.stdout)
				}
			}
			if created.Load() != 9 {
				t.Errorf("the API created %d items, want 9 (one per execution)", created.Load())
			}
		})
	}
}
