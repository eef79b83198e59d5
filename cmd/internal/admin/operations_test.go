package admin_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/admin"
	"github.com/idemkit/idem/steps"
)

// opError is the dead operation's error: markup the page must escape.
const opError = `<script>alert("op")</script> provider down`

// makeOps makes, through the real API on the fixture's store and
// journal, the operations "refund" of ("acct-7", "refund-secret-1"),
// dead (its step failed its only attempt), "ship" of ("", "ship-1"),
// waiting (failed once, retried in an hour), and "ship" of ("",
// "ship-2"), done.
func (f *fixture) makeOps(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	g, err := idem.NewGuard(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	runner := func(max int) *steps.Runner {
		r, err := steps.New(g, f.ops, &steps.Config{MaxAttempts: max, Backoff: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	refund, err := steps.Define(runner(1), "refund", func(ctx context.Context, s *steps.Run, order string) (string, error) {
		return steps.Foreign(s, "provider", func(ctx context.Context, key string) (string, error) { return "", errors.New(opError) })
	}, &steps.OpConfig[string, string]{Key: func(string) (string, string, error) { return "acct-7", "refund-secret-1", nil }})
	if err != nil {
		t.Fatal(err)
	}
	ship, err := steps.Define(runner(5), "ship", func(ctx context.Context, s *steps.Run, key string) (string, error) {
		if key == "ship-1" {
			return "", errors.New("carrier unavailable")
		}
		return "shp_1", nil
	}, &steps.OpConfig[string, string]{Key: func(key string) (string, string, error) { return "", key, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := refund.Call(ctx, "order-1"); err == nil {
		t.Fatal("the refund succeeded")
	}
	if _, _, err := ship.Call(ctx, "ship-1"); err == nil {
		t.Fatal("ship-1 succeeded")
	}
	if _, _, err := ship.Call(ctx, "ship-2"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		scope, key string
		want       steps.State
	}{{"acct-7", "refund-secret-1", steps.StateDead}, {"", "ship-1", steps.StateWaiting}, {"", "ship-2", steps.StateDone}} {
		if got := f.op(t, c.scope, c.key).State; got != c.want {
			t.Fatalf("operation %q is %s, want %s", c.key, got, c.want)
		}
	}
}

func (f *fixture) op(t *testing.T, scope, key string) steps.Entry {
	t.Helper()
	e, err := f.ops.Get(t.Context(), scope, key)
	if err != nil {
		t.Fatalf("Get(%q, %q): %v", scope, key, err)
	}
	return e
}

// due reports whether the completer of name would take key up now.
func (f *fixture) due(t *testing.T, name, key string) bool {
	t.Helper()
	ops, err := f.ops.Due(t.Context(), name, 100)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ops, func(op steps.Entry) bool { return op.Key == key })
}

func TestRetryOperation(t *testing.T) {
	f := setup(t, nil)
	f.makeOps(t)
	cookie, csrf := f.login(t)
	dead, waiting := idem.HashKey("acct-7", "refund-secret-1"), idem.HashKey("", "ship-1")
	page := f.send(t, "GET", "/admin/", "cookie:"+cookie, nil)
	_, opsPart, _ := strings.Cut(page.body, `<section id="operations-section"><h2>Operations</h2>`)
	deadPart, waitingPart, _ := strings.Cut(opsPart, "<h3>Waiting</h3>")
	if opsPart == "" ||
		!strings.Contains(deadPart, `class="retry-op" data-hash="`+dead+`"`) || !strings.Contains(deadPart, "refund-secret-1") ||
		!strings.Contains(deadPart, "provider down") || !strings.Contains(waitingPart, `class="retry-op" data-hash="`+waiting+`"`) ||
		strings.Contains(opsPart, idem.HashKey("", "ship-2")) {
		t.Fatalf("the page does not list the dead and the waiting operation (and only them) with retry buttons:\n%s", page.body)
	}
	if strings.Contains(page.body, `<script>alert("op")`) {
		t.Fatalf("the page holds the operation's error as markup:\n%s", page.body)
	}

	// The page's button: first the confirmation page; nothing changes.
	form := url.Values{"csrf": {csrf}, "scope64": {"YWNjdC03"}, "key64": {"cmVmdW5kLXNlY3JldC0x"}}
	a := f.send(t, "POST", "/admin/retry-op", "cookie:"+cookie, form)
	if a.code != http.StatusOK || !strings.Contains(a.body, "Retry operation "+dead+"?") || !strings.Contains(a.body, "dead after 1 attempts") ||
		!strings.Contains(a.body, `name="confirm" value="yes"`) || strings.Contains(a.body, `<script>alert("op")`) {
		t.Fatalf("confirmation page: %d\n%s", a.code, a.body)
	}
	if e := f.op(t, "acct-7", "refund-secret-1"); e.State != steps.StateDead {
		t.Fatalf("the operation is %s before the confirmation, want dead", e.State)
	}
	// Without the session's CSRF token: refused.
	noCSRF := url.Values{"scope64": form["scope64"], "key64": form["key64"], "confirm": {"yes"}}
	if a := f.send(t, "POST", "/admin/retry-op", "cookie:"+cookie, noCSRF); a.code != http.StatusForbidden || f.op(t, "acct-7", "refund-secret-1").State != steps.StateDead {
		t.Fatalf("retry without CSRF: %d, want 403 and the operation dead", a.code)
	}
	form.Set("confirm", "yes")
	a = f.send(t, "POST", "/admin/retry-op", "cookie:"+cookie, form)
	if a.code != http.StatusSeeOther || a.header.Get("Location") != "/admin/?done=op-retried&ref="+dead {
		t.Fatalf("retry: %d, Location %q\n%s", a.code, a.header.Get("Location"), a.body)
	}
	if e := f.op(t, "acct-7", "refund-secret-1"); e.State != steps.StateWaiting || e.Attempts != 0 || !f.due(t, "refund", "refund-secret-1") {
		t.Fatalf("after the retry: %s, %d attempts; want waiting, 0 attempts, due", e.State, e.Attempts)
	}
	page = f.send(t, "GET", "/admin/?done=op-retried&ref="+dead, "cookie:"+cookie, nil)
	_, opsPart, _ = strings.Cut(page.body, `<section id="operations-section">`)
	deadPart, waitingPart, _ = strings.Cut(opsPart, "<h3>Waiting</h3>")
	if !strings.Contains(page.body, "Operation "+dead+" retried") || strings.Contains(deadPart, `data-hash="`+dead+`"`) || !strings.Contains(waitingPart, `data-hash="`+dead+`"`) {
		t.Fatalf("the page after the retry:\n%s", page.body)
	}

	// A waiting operation is made due now, its attempts kept.
	if f.due(t, "ship", "ship-1") {
		t.Fatal("the waiting operation is due before its retry")
	}
	if a := f.send(t, "POST", "/admin/retry-op", "bearer:"+token, url.Values{"key": {"ship-1"}, "confirm": {"yes"}}); a.code != http.StatusSeeOther {
		t.Fatalf("retry of the waiting operation: %d %s", a.code, a.body)
	}
	if e := f.op(t, "", "ship-1"); e.State != steps.StateWaiting || e.Attempts != 1 || !f.due(t, "ship", "ship-1") {
		t.Fatalf("the waiting operation after its retry: %s, %d attempts; want waiting, 1, due", e.State, e.Attempts)
	}

	logs := f.log.String()
	if !strings.Contains(logs, "operation retried") || !strings.Contains(logs, "key_hash="+dead) || !strings.Contains(logs, "remote=192.0.2.7:41000") {
		t.Fatalf("the retry's log line lacks what, which or who:\n%s", logs)
	}
	if strings.Contains(logs, "refund-secret-1") {
		t.Fatalf("the log shows the raw key:\n%s", logs)
	}
}

// A done operation (and a running one) has nothing to retry: 409 on the
// confirmation and on the confirmed post, and it stays as it was; a key
// without an operation is 404.
func TestRetryOperationRefused(t *testing.T) {
	f := setup(t, func(c *admin.Config) { c.LogKeys = true })
	f.makeOps(t)
	done := idem.HashKey("", "ship-2")
	for _, confirm := range []string{"", "yes"} {
		a := f.send(t, "POST", "/admin/retry-op", "bearer:"+token, url.Values{"key": {"ship-2"}, "confirm": {confirm}})
		if a.code != http.StatusConflict || !strings.Contains(a.body, "operation "+done+" is done: nothing to retry") {
			t.Fatalf("retry of a done operation (confirm %q): %d %s", confirm, a.code, a.body)
		}
	}
	if e := f.op(t, "", "ship-2"); e.State != steps.StateDone {
		t.Fatalf("the done operation is %s after a refused retry", e.State)
	}
	for _, confirm := range []string{"", "yes"} {
		if a := f.send(t, "POST", "/admin/retry-op", "bearer:"+token, url.Values{"key": {"no-such-op"}, "confirm": {confirm}}); a.code != http.StatusNotFound {
			t.Fatalf("retry of no operation (confirm %q): %d %s", confirm, a.code, a.body)
		}
	}
	if a := f.send(t, "POST", "/admin/retry-op", "bearer:"+token, url.Values{"scope": {"acct-7"}}); a.code != http.StatusBadRequest {
		t.Fatalf("retry without a key: %d", a.code)
	}
	if logs := f.log.String(); !strings.Contains(logs, "retry refused") || !strings.Contains(logs, "key=ship-2") {
		t.Fatalf("with LogKeys, the refusal's log lacks the key:\n%s", logs)
	}
}

// Without Config.Operations there is no section and no retry.
func TestNoOperations(t *testing.T) {
	f := setup(t, func(c *admin.Config) { c.Operations = nil })
	f.makeOps(t)
	if page := f.send(t, "GET", "/admin/", "bearer:"+token, nil); strings.Contains(page.body, "operations-section") {
		t.Fatalf("the page has an operations section:\n%s", page.body)
	}
	a := f.send(t, "POST", "/admin/retry-op", "bearer:"+token, url.Values{"scope": {"acct-7"}, "key": {"refund-secret-1"}, "confirm": {"yes"}})
	if a.code != http.StatusNotFound || f.op(t, "acct-7", "refund-secret-1").State != steps.StateDead {
		t.Fatalf("retry without Operations: %d; want 404 and the operation dead", a.code)
	}
}
