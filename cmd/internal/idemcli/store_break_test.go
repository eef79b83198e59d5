package idemcli

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// What a record holds comes from whoever wrote it: an upstream's headers
// and body may carry terminal escape sequences (set a window title, clear
// the screen, rewrite what the operator reads) or binary bytes. idem
// inspect shows them escaped, never raw, and still shows every byte.
func TestInspectEscapesStoredBytes(t *testing.T) {
	t.Parallel()
	raw, st := storeAt(t)
	hostile := "\x1b]0;owned\x07\x1b[2J\x1b[1A"
	binary := append([]byte(hostile+"\x00\xff\xfe"), "tail"...)
	put(t, st.store, "", "hostile", time.Minute, time.Hour, &idem.Response{
		StatusCode: 200,
		Header:     map[string][]string{"Content-Type": {"text/plain" + hostile}, "X-Evil" + hostile: {"v"}},
		Body:       binary,
	})
	put(t, st.store, "", "text", time.Minute, time.Hour, &idem.Response{
		StatusCode: 200, Body: []byte("line one\n\tline two, ünïcode\n"),
	})

	code, out, errOut := run(t, "", "inspect", "-db", raw, "-key", "hostile", "-body")
	if code != exitOK {
		t.Fatalf("inspect: exit %d %s", code, errOut)
	}
	if strings.ContainsAny(out, "\x1b\x07\x00") || strings.Contains(out, "\xff") {
		t.Fatalf("inspect printed control or binary bytes raw:\n%q", out)
	}
	for _, want := range []string{`\x1b]0;owned\a`, "1b 5b 32 4a", "00 ff fe 74", "|1A...tail|"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = run(t, "", "inspect", "-db", raw, "-key", "text", "-body")
	if code != exitOK || !strings.Contains(out, "line one\n\tline two, ünïcode\n") {
		t.Fatalf("inspect of a text body: exit %d %s\n%s; want the text as it is", code, errOut, out)
	}
}
