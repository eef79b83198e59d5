package shop

import (
	"os"
	"strings"
	"testing"
)

// Every code of the shop's own has a section in PROBLEMS.md that says its
// status and code, and a row in its table: a code added to shopCodes
// without its documentation fails here, even before a test provokes it.
func TestEveryShopCodeHasASection(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("PROBLEMS.md")
	if err != nil {
		t.Fatal(err)
	}
	for code := range shopCodes {
		if !strings.Contains(string(doc), "\n## "+strings.ToLower(code)+"\n") {
			t.Errorf("PROBLEMS.md has no section %q", strings.ToLower(code))
		}
		if !strings.Contains(string(doc), " `"+code+"`") {
			t.Errorf("PROBLEMS.md does not name `%s`", code)
		}
	}
}
