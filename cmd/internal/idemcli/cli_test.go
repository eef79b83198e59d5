package idemcli

import (
	"strings"
	"testing"
)

func TestMainUsage(t *testing.T) {
	code, out, errOut := run(t, "")
	if code != exitUsage || out != "" {
		t.Fatalf("idem without a command: exit %d, stdout %q; want 2 and nothing on stdout", code, out)
	}
	for name, c := range commands {
		if !strings.Contains(errOut, name) || !strings.Contains(errOut, c.synopsis) {
			t.Errorf("usage does not list %s (%q):\n%s", name, c.synopsis, errOut)
		}
	}
}

func TestHelpListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, errOut := run(t, "", args...)
		if code != exitOK || errOut != "" {
			t.Fatalf("idem %v: exit %d, stderr %q", args, code, errOut)
		}
		for _, name := range []string{"probe", "proxy", "migrate", "sweep", "inspect", "evict", "help"} {
			if !strings.Contains(out, "\n  "+name+" ") {
				t.Errorf("idem %v does not list %s:\n%s", args, name, out)
			}
		}
	}
}

func TestHelpOfEachCommand(t *testing.T) {
	for name := range commands {
		code, out, errOut := run(t, "", "help", name)
		if code != exitOK || errOut != "" {
			t.Fatalf("idem help %s: exit %d, stderr %q", name, code, errOut)
		}
		if !strings.Contains(out, "idem "+name) {
			t.Errorf("idem help %s does not show its usage line:\n%s", name, out)
		}
		// -h after the command prints the same help on stdout, exit 0.
		code, out2, _ := run(t, "", name, "-h")
		if code != exitOK || out2 != out {
			t.Errorf("idem %s -h: exit %d, and its text differs from idem help %s", name, code, name)
		}
	}
}

func TestUnknownCommandAndFlag(t *testing.T) {
	code, _, errOut := run(t, "", "prob")
	if code != exitUsage || !strings.Contains(errOut, `unknown command "prob"`) || !strings.Contains(errOut, "idem help") {
		t.Fatalf("unknown command: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = run(t, "", "help", "nope")
	if code != exitUsage || !strings.Contains(errOut, `"nope"`) {
		t.Fatalf("idem help nope: exit %d, stderr %q", code, errOut)
	}
	for name := range commands {
		code, _, errOut = run(t, "", name, "-no-such-flag")
		if code != exitUsage || !strings.Contains(errOut, "no-such-flag") || !strings.Contains(errOut, "idem help "+name) {
			t.Errorf("idem %s -no-such-flag: exit %d, stderr %q; want 2, the flag and the help to read", name, code, errOut)
		}
	}
}
