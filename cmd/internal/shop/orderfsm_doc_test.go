package shop

import (
	"os"
	"strings"
	"testing"
)

// The order machine's diagram in the README's shop section and in the
// package doc is what orderMachine.Mermaid() draws, so the docs never show
// a machine the shop no longer runs.
func TestOrderDiagramIsCurrent(t *testing.T) {
	t.Parallel()
	want := orderMachine.Mermaid()

	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section, ok := between(string(readme), "\n## The shop, step by step\n", "\n## ")
	if !ok {
		t.Fatal(`README.md has no section "## The shop, step by step"`)
	}
	got, ok := between(section, "```mermaid\n", "```\n")
	if !ok {
		t.Fatal("the README's shop section has no ```mermaid block")
	}
	if got != want {
		t.Errorf("the README's order diagram is stale:\n%s\nwant orderMachine.Mermaid():\n%s", got, want)
	}

	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var block strings.Builder
	for line := range strings.Lines(want) {
		block.WriteString("//\t" + line)
	}
	if !strings.Contains(string(doc), block.String()+"//\n") {
		t.Errorf("doc.go does not hold orderMachine.Mermaid() as a code block:\n%s", block.String())
	}
}

// between returns the text of s after the first start up to the next end.
func between(s, start, end string) (string, bool) {
	_, after, ok := strings.Cut(s, start)
	if !ok {
		return "", false
	}
	in, _, ok := strings.Cut(after, end)
	return in, ok
}
