package idemhttp_test

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemhttp"
)

// TestProblemTypes: every code the middleware answers with has a type
// URI that points at its section of PROBLEMS.md, and the section is
// there; only other codes get "about:blank".
func TestProblemTypes(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("PROBLEMS.md")
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://github.com/idemkit/idem/blob/main/idemhttp/PROBLEMS.md#"
	for _, code := range []string{
		idemhttp.CodeMissingKey, idemhttp.CodeInvalidKey, idemhttp.CodeInvalidScope,
		idemhttp.CodeInvalidRequest, idemhttp.CodeUnauthenticated, idemhttp.CodeKeyMismatch,
		idemhttp.CodeProcessing, idemhttp.CodeBodyTooLarge, idemhttp.CodeStoreUnavailable,
		idemhttp.CodeSpoolUnavailable, "OUT_OF_STOCK",
	} {
		w := httptest.NewRecorder()
		idemhttp.WriteProblem(w, 400, code, "", "")
		var p struct{ Type, Code string }
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Code != code {
			t.Fatalf("%s: %s, %v", code, w.Body, err)
		}
		want := base + strings.ToLower(code)
		if code == "OUT_OF_STOCK" {
			want = "about:blank"
		} else if !strings.Contains(string(doc), "\n## "+strings.ToLower(code)+"\n") {
			t.Errorf("PROBLEMS.md has no section for %s", code)
		}
		if p.Type != want {
			t.Errorf("%s: type %q, want %q", code, p.Type, want)
		}
	}
}
