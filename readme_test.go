package idem_test

import (
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// docFiles are the package docs whose code blocks must be excerpts of
// examples, like the README's Go blocks.
var docFiles = []string{"idemhttp/doc.go", "idemgrpc/doc.go", "idemclient/doc.go"}

// Every ```go block of README.md, and every code block of the package
// comments in docFiles, is a verbatim excerpt of a compiled example: a run
// of consecutive lines of an example*_test.go file of this repository,
// equal to the block once each side's common leading indentation is
// removed. A snippet that drifts from its example fails here.
func TestDocSnippets(t *testing.T) {
	t.Parallel()
	examples := exampleFiles(t)
	if len(examples) == 0 {
		t.Fatal("no example*_test.go files found")
	}

	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := markdownGoBlocks(string(readme))
	if len(blocks) == 0 {
		t.Error("README.md has no ```go block")
	}
	for _, b := range blocks {
		checkExcerpt(t, "README.md:"+b.where, b.lines, examples)
	}

	for _, path := range docFiles {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.FromSlash(path), nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc == nil {
			t.Errorf("%s: no package comment", path)
			continue
		}
		var p comment.Parser
		n := 0
		for _, block := range p.Parse(f.Doc.Text()).Content {
			if code, ok := block.(*comment.Code); ok {
				n++
				checkExcerpt(t, path+": code block "+strconv.Itoa(n), strings.Split(strings.TrimSuffix(code.Text, "\n"), "\n"), examples)
			}
		}
		if n == 0 {
			t.Errorf("%s: no code block in the package comment", path)
		}
	}
}

// snippet is a ```go block: its lines, and where it starts.
type snippet struct {
	where string
	lines []string
}

// markdownGoBlocks returns the ```go fenced blocks of a Markdown text.
func markdownGoBlocks(text string) []snippet {
	var blocks []snippet
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		start := i + 1
		end := start
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		blocks = append(blocks, snippet{where: "line " + strconv.Itoa(start), lines: lines[start:end]})
		i = end
	}
	return blocks
}

// exampleFiles returns the lines of every example*_test.go file under the
// repository's root, by path.
func exampleFiles(t *testing.T) map[string][]string {
	t.Helper()
	files := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(name, "example") && strings.HasSuffix(name, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files[filepath.ToSlash(path)] = strings.Split(string(b), "\n")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// checkExcerpt fails unless block is an excerpt of one of the examples.
func checkExcerpt(t *testing.T, name string, block []string, examples map[string][]string) {
	t.Helper()
	want := trimBlank(dedent(block))
	if len(want) == 0 {
		t.Errorf("%s: empty block", name)
		return
	}
	m := findExcerpt(want, examples)
	if m.found {
		return
	}
	msg := name + ": not a verbatim excerpt of any example*_test.go file:\n" + strings.Join(want, "\n")
	if m.same > 0 {
		msg += "\nclosest: " + m.file + " line " + strconv.Itoa(m.line) +
			", which differs at the block's line " + strconv.Itoa(m.same+1) + ": " + want[m.same]
	}
	t.Error(msg)
}

// excerptMatch is where findExcerpt found a block, or came closest.
type excerptMatch struct {
	found bool
	file  string
	line  int // 1-based
	same  int // lines equal from the block's start
}

// findExcerpt looks for want (dedented) in the examples.
func findExcerpt(want []string, examples map[string][]string) excerptMatch {
	best := excerptMatch{same: -1}
	for path, lines := range examples {
		for i := 0; i+len(want) <= len(lines); i++ {
			got := dedent(lines[i : i+len(want)])
			n := 0
			for n < len(want) && got[n] == want[n] {
				n++
			}
			if n == len(want) {
				return excerptMatch{found: true, file: path, line: i + 1, same: n}
			}
			if n > best.same || n == best.same && (path < best.file || path == best.file && i+1 < best.line) {
				best = excerptMatch{file: path, line: i + 1, same: n}
			}
		}
	}
	return best
}

// trimBlank drops blank lines at both ends.
func trimBlank(lines []string) []string {
	for len(lines) > 0 && lines[0] == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// The excerpt check itself: indentation may differ as a whole, nothing
// else may.
func TestFindExcerpt(t *testing.T) {
	t.Parallel()
	examples := map[string][]string{"example_test.go": strings.Split(
		"func Example() {\n\tx := f(\n\t\t1,\n\t)\n\n\tg(x)\n}\n", "\n")}
	for _, tc := range []struct {
		block string
		found bool
	}{
		{"x := f(\n\t1,\n)", true},
		{"\t\tx := f(\n\t\t\t1,\n\t\t)\n", true},
		{")\n\ng(x)", true},
		{"x := f(\n\t1,\n)\ng(x)", false}, // lines left out
		{"x := f(\n1,\n)", false},         // indentation changed inside
		{"x := f(\n\t2,\n)", false},
		{"g(x) ", true}, // trailing white space does not count
	} {
		want := trimBlank(dedent(strings.Split(tc.block, "\n")))
		if got := findExcerpt(want, examples); got.found != tc.found {
			t.Errorf("%q: found %v, want %v", tc.block, got.found, tc.found)
		}
	}
}

// dedent returns lines without their common leading white space (blank
// lines do not count, and become empty) and without trailing white space.
func dedent(lines []string) []string {
	prefix, first := "", true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = indent, false
			continue
		}
		for !strings.HasPrefix(indent, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		out[i] = strings.TrimRight(strings.TrimPrefix(l, prefix), " \t\r")
	}
	return out
}
