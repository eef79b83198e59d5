package lincheck

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// History collects the calls of many goroutines.
type History struct {
	mu  sync.Mutex
	ops []porcupine.Operation
}

// NewHistory starts a history.
func NewHistory() *History { return &History{} }

// now is the machine's wall clock in Unix nanoseconds: the clock the
// loopback servers read too.
func now() int64 { return time.Now().UnixNano() }

// add records one call of client.
func (h *History) add(client int, in, out any, call, ret int64) {
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
	h.mu.Unlock()
}

// Len is the number of calls recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Stats counts the calls whose outcome is unknown.
func (h *History) unknown() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, op := range h.ops {
		if op.Return >= Never {
			n++
		}
	}
	return n
}

// CheckTimeout bounds the checker's search; a history it cannot decide
// in that time fails the test (the workload is then too concurrent to be
// checked, which is a defect of the test).
var CheckTimeout = 2 * time.Minute

// Check checks the history against model and fails t with the calls of
// the first partition that has no linearization. porcupine's
// visualisation of the history goes to t.ArtifactDir (kept with
// go test -artifacts).
func (h *History) Check(t testing.TB, model porcupine.Model) {
	t.Helper()
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, CheckTimeout)
	t.Logf("checked %d calls (%d of unknown outcome) in %v: %s", len(ops), h.unknown(), time.Since(start).Round(time.Millisecond), res)
	if res == porcupine.Ok {
		return
	}
	if ad, ok := t.(interface{ ArtifactDir() string }); ok {
		path := filepath.Join(ad.ArtifactDir(), "history.html")
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Logf("visualisation: %s", path)
		}
	}
	if res == porcupine.Unknown {
		t.Fatalf("the checker did not decide within %v: make the workload smaller", CheckTimeout)
	}
	t.Errorf("the history is not linearizable:\n%s", h.explain(model, info))
}

// explain prints the partition that failed: the end of the longest
// order the model accepted, the states the model could be in after it,
// and the calls it could not place, earliest first.
func (h *History) explain(model porcupine.Model, info porcupine.LinearizationInfo) string {
	var b strings.Builder
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	parts := model.Partition(ops)
	for i, partial := range info.PartialLinearizationsOperations() {
		if len(partial) == 0 || i >= len(parts) {
			continue
		}
		longest := partial[0]
		for _, p := range partial {
			if len(p) > len(longest) {
				longest = p
			}
		}
		if len(longest) == len(parts[i]) {
			continue
		}
		fmt.Fprintf(&b, "partition %d: the longest order the model accepts has %d of its %d calls; it ends:\n", i, len(longest), len(parts[i]))
		for _, op := range tail(longest, 25) {
			fmt.Fprintf(&b, "  %s\n", h.line(model, op))
		}
		state := model.Init()
		for _, op := range longest {
			_, state = model.Step(state, op.Input, op.Output)
		}
		fmt.Fprintf(&b, "the model's state then: %s\n", model.DescribeState(state))
		placed := map[string]bool{}
		for _, op := range longest {
			placed[h.line(model, op)] = true
		}
		rest := slices.DeleteFunc(slices.Clone(parts[i]), func(op porcupine.Operation) bool { return placed[h.line(model, op)] })
		slices.SortFunc(rest, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
		fmt.Fprintf(&b, "the first calls it could not place:\n")
		for _, op := range rest[:min(len(rest), 12)] {
			fmt.Fprintf(&b, "  %s\n", h.line(model, op))
		}
		fmt.Fprintf(&b, "the partition's calls of unknown outcome:\n")
		for _, op := range parts[i] {
			if op.Return >= Never {
				fmt.Fprintf(&b, "  %s\n", h.line(model, op))
			}
		}
		if dir := os.Getenv("IDEM_LINCHECK_DUMP"); dir != "" {
			var all strings.Builder
			sorted := slices.Clone(parts[i])
			slices.SortFunc(sorted, func(a, b porcupine.Operation) int { return int(a.Call - b.Call) })
			for _, op := range sorted {
				fmt.Fprintf(&all, "%s\n", h.line(model, op))
			}
			path := filepath.Join(dir, fmt.Sprintf("lincheck-%d.txt", time.Now().UnixNano()))
			if err := os.WriteFile(path, []byte(all.String()), 0o644); err == nil {
				fmt.Fprintf(&b, "the partition's calls: %s\n", path)
			}
		}
		break
	}
	return b.String()
}

func tail[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (h *History) line(model porcupine.Model, op porcupine.Operation) string {
	return fmt.Sprintf("[%s, %s] c%d %s", describeTime(op.Call), describeTime(op.Return),
		op.ClientId, model.DescribeOperation(op.Input, op.Output))
}

// Linearizable reports whether the history checks against model, for
// tests of the checker itself.
func (h *History) Linearizable(model porcupine.Model) bool {
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	return porcupine.CheckOperationsTimeout(model, ops, CheckTimeout) == porcupine.Ok
}
