package admin_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idem/steps"
)

// hostileOp is markup, an attribute break-out, escape sequences, a
// bidi override and invalid UTF-8, which the page must show as text.
const hostileOp = "<img src=x onerror=alert(1)>\"'><b>\x1b[2J\u202egnp.exe\xff"

var opForm = regexp.MustCompile(`name="scope64" value="([A-Za-z0-9_-]*)"><input type="hidden" name="key64" value="([A-Za-z0-9_-]+)"><button type="submit" class="retry-op"`)

// Operations whose every stored field is hostile (written by another
// program, or an old bug) are listed and confirmed as text: no markup,
// no control character, bidi override or invalid UTF-8 reaches the
// page; and their retry buttons retry them.
func TestOperationsHostileValues(t *testing.T) {
	f := setup(t, nil)
	ctx := t.Context()
	long := strings.Repeat("é", 5000)
	for i, v := range []string{hostileOp, long} {
		// A key a record can have, as Begin requires; name, fingerprint
		// and error anything.
		key := fmt.Sprintf("op-%d-%s", i, strings.Repeat("\u202e<i>", 10))
		if _, err := f.ops.DB().ExecContext(ctx, `INSERT INTO idem_ops (scope, idempotency_key, name, fingerprint, input, status, attempts, next_at, last_error, created_at, updated_at, expires_at)
VALUES (?, ?, ?, ?, ?, 'dead', 3, 0, ?, 0, 0, 0)`, "<s>\u202e", key, "n"+v, "fp"+v, []byte(v), "err"+v); err != nil {
			t.Fatal(err)
		}
	}
	clean := func(what, body string) {
		t.Helper()
		if !utf8.ValidString(body) {
			t.Fatalf("%s is not UTF-8:\n%q", what, body)
		}
		for _, bad := range []string{"<img", "<b>", "<i>", "<s>", "\x1b", "\u202e", `"'>`} {
			if strings.Contains(body, bad) {
				t.Fatalf("%s holds %q raw:\n%s", what, bad, body)
			}
		}
	}
	page := f.send(t, "GET", "/admin/", "bearer:"+token, nil)
	_, ops, _ := strings.Cut(page.body, `<section id="operations-section">`)
	if page.code != http.StatusOK || strings.Count(ops, `class="retry-op"`) != 2 || !strings.Contains(ops, html.EscapeString(`"n<img src=x onerror=alert(1)>`)) {
		t.Fatalf("page: %d\n%s", page.code, page.body)
	}
	clean("the page", page.body)
	for _, m := range opForm.FindAllStringSubmatch(ops, -1) {
		form := url.Values{"scope64": {m[1]}, "key64": {m[2]}}
		a := f.send(t, "POST", "/admin/retry-op", "bearer:"+token, form)
		if a.code != http.StatusOK || !strings.Contains(a.body, "dead after 3 attempts") {
			t.Fatalf("confirmation: %d\n%s", a.code, a.body)
		}
		clean("the confirmation page", a.body)
		form.Set("confirm", "yes")
		if a := f.send(t, "POST", "/admin/retry-op", "bearer:"+token, form); a.code != http.StatusSeeOther {
			t.Fatalf("retry: %d %s", a.code, a.body)
		}
	}
	dead, err := f.ops.List(ctx, steps.StateDead, 10)
	if err != nil || len(dead) != 0 {
		t.Fatalf("dead after the retries: %d, %v; want none", len(dead), err)
	}
	waiting, err := f.ops.List(ctx, steps.StateWaiting, 10)
	if err != nil || len(waiting) != 2 || waiting[0].Attempts != 0 || waiting[1].Attempts != 0 {
		t.Fatalf("waiting after the retries: %+v, %v; want both, 0 attempts", waiting, err)
	}
}
