package probe_test

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"

	"github.com/idemkit/idem/cmd/internal/probe"
)

// truth is the status a check must have against a third-party
// middleware, and why: what in the middleware's source makes it so.
type truth struct {
	status probe.Status
	why    string
}

// fiberDefaults is the ground truth of gofiber/fiber v2.52.15's
// middleware/idempotency as idempotency.New() makes it: header
// X-Idempotency-Key, a key valid only at exactly 36 bytes, every response
// header kept, safe methods skipped, in-memory lock and storage. What the
// middleware does, from its source (idempotency.go, config.go):
//
//   - a request whose key header is empty or absent runs unguarded
//     (c.Next());
//   - a key KeyHeaderValidate refuses is returned as a plain error, which
//     fiber's default error handler answers 500, text/plain;
//   - the storage is keyed by the key alone: no caller, no method, no
//     path, no fingerprint of the request;
//   - a key found in the storage is answered from it (status, kept
//     headers, body), unmarked; otherwise the key's lock is taken, the
//     storage read again, and the handler run: a duplicate in flight waits
//     on the lock and is then answered from the storage, never 409;
//   - whatever status the handler sets is stored when it returns nil;
//     only a returned error (fiber's 404 and 405 among them) is not.
var fiberDefaults = map[string]truth{
	"retry-replay": {probe.Pass, "a retry finds the key in the storage and gets its status, headers and body: the first answer byte for byte"},
	"replay-marker": {probe.Fail, "a replay is written as stored, with no header of the middleware's own: " +
		"nothing marks it (IsFromCache is a local of the handler's context, not a header)"},
	"concurrent": {probe.Pass, "the first duplicate takes the key's lock; the others wait on it (MemoryLock), " +
		"read the storage again and replay the stored answer: one execution"},
	"concurrent-409": {probe.Warning, "the middleware never answers 409: a duplicate in flight waits on the lock and replays"},
	"concurrent-mismatch": {probe.Fail, "nothing compares a request with the key's first: every request of the other " +
		"body, in flight or after, gets the body's answer (or, when it won the lock, the body's requests get its)"},
	"retry-after":    {probe.NotApplicable, "no 409 ever, so no Retry-After to judge"},
	"mismatch-422":   {probe.Fail, "no fingerprint: the same key with another body replays the first answer"},
	"after-mismatch": {probe.NotApplicable, "mismatch-422 got no 422"},
	"reordered-json": {probe.Pass, "no fingerprint at all: any body under a stored key replays, reordered JSON among them"},
	"two-keys":       {probe.Pass, "two keys are two storage entries: both execute"},
	"header-case": {probe.Pass, "fasthttp canonicalises request header names and c.Get looks the name up canonicalised: " +
		"both spellings are the same header"},
	"quoted-key": {probe.Fail, "the quoted key is 38 bytes; the default KeyHeaderValidate takes exactly 36 and returns a " +
		"plain error: 500"},
	"bare-key": {probe.NotApplicable, "quoted-key did not pass"},
	"missing-key": {probe.Fail, "an absent key runs the handler unguarded (key == \"\" → c.Next()), and the middleware has no " +
		"option to require one; the Config says keys are required (with KeyRequired false this is n/a)"},
	"malformed-key": {probe.Fail, "the key with a tab is 27 bytes: the length validation refuses it with a plain error, 500, " +
		"not 400 (the empty key runs unguarded, the non-UTF-8 one is 500 too)"},
	"strict-key-validation": {probe.Fail, "the empty key runs unguarded (201) and the non-UTF-8 key gets 500: neither is 400"},
	"overlong-key":          {probe.Fail, "any length but 36 is a plain error from KeyHeaderValidate: the 256-byte key gets 500, not 400"},
	"stored-4xx": {probe.Warning, "the handler's 400 is returned as a status (c.Status(400).JSON), not an error, so it is " +
		"stored and replayed, but unmarked: the probe cannot tell it from the request refused again"},
	"released-5xx": {probe.Fail, "the handler's 500 is a returned status, stored like any other: its retry and the accepted " +
		"body under the key get the 500 again (only a returned error skips the storage)"},
	"scoped-keys": {probe.Fail, "the storage is keyed by the key alone: the second caller sending the first caller's key gets " +
		"the first caller's answer (and the effect does not move)"},
	"get-untouched": {probe.Pass, "the default Next skips safe methods (fiber.IsMethodSafe): a GET with a key reaches the router " +
		"untouched (405 on /api, the count on /count)"},
	"private-headers": {probe.Fail, "KeepResponseHeaders nil keeps every header: the execution's Set-Cookie session=s<n> is " +
		"stored and replayed to whoever retries the key"},
	"problem-bodies": {probe.NotApplicable, "no key is refused with 400, 409 or 422: bad keys get 500, duplicates wait, another " +
		"body replays"},
	"expiry": {probe.NotApplicable, "the Config gives no Retention (the default Lifetime is 30 min)"},
	"effect": {probe.Pass, "every 2xx the probe counts as an execution ran the handler once and every replay ran nothing: " +
		"the count moved by the executions the answers show"},
}

// fiberCareful is the ground truth of the middleware as a careful user
// configures it (fiberCarefulConfig): the draft's header, keys of 1 to
// 255 bytes without control characters refused with 400, only
// Content-Type and Location kept, safe methods still skipped. What care
// cannot add is a fingerprint, a scope, a required key or a way to let a
// 5xx go.
var fiberCareful = amend(fiberDefaults, map[string]truth{
	"quoted-key": {probe.Pass, "the quoted key (38 bytes) passes the 1–255 validation and names an entry of its own, quotes " +
		"included: sent twice, it replays"},
	"bare-key": {probe.Fail, "the bare key is another string, so another entry: it executes again (the quotes are part of " +
		"the key)"},
	"malformed-key": {probe.Warning, "the key with a tab fails KeyHeaderValidate, whose *fiber.Error is answered 400; the " +
		"empty key never reaches the validation (it runs unguarded) and the non-UTF-8 key has no control byte: both 201"},
	"strict-key-validation": {probe.Fail, "the empty and the non-UTF-8 key are taken (201), not refused with 400"},
	"overlong-key":          {probe.Pass, "256 bytes fails the 1–255 validation: 400"},
	"private-headers": {probe.Pass, "KeepResponseHeaders (Content-Type, Location) leaves Set-Cookie out of the storage: " +
		"replays carry no session"},
	"problem-bodies": {probe.Fail, "the 400s to bad keys are fiber's default error handler's: text/plain, not problem details"},
})

// fiberCustomNext is the ground truth of fiberCareful's configuration
// with a Next of the user's own (a health check skipped): a Next set
// replaces the default one, safe methods are no longer skipped, and a GET
// carrying a POST's key is answered from the POST's entry.
var fiberCustomNext = amend(fiberCareful, map[string]truth{
	"get-untouched": {probe.Fail, "the Next given replaces the default's safe-method skip: a GET with the concurrent check's " +
		"key, on /api and on /count, finds the POST's entry and gets the POST's 201 replayed"},
})

// amend returns base with the rows of over replacing its own.
func amend(base, over map[string]truth) map[string]truth {
	out := maps.Clone(base)
	maps.Copy(out, over)
	return out
}

// fiberCarefulConfig is what a careful user of fiber's idempotency
// middleware configures.
func fiberCarefulConfig() idempotency.Config {
	return idempotency.Config{
		KeyHeader: "Idempotency-Key",
		KeyHeaderValidate: func(k string) error {
			// A *fiber.Error: fiber's error handler answers its code (a
			// plain error, as the default validation returns, is 500).
			if len(k) < 1 || len(k) > 255 || strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
				return fiber.NewError(fiber.StatusBadRequest, "the Idempotency-Key must be 1 to 255 bytes without control characters")
			}
			return nil
		},
		KeepResponseHeaders: []string{fiber.HeaderContentType, fiber.HeaderLocation},
	}
}

// TestThirdPartyFiber probes gofiber/fiber's idempotency middleware
// (v2.52.15) in front of an API whose effect it counts, in three
// configurations: the defaults, a careful one, and the careful one with a
// Next of the user's own. Every check's status, the core grade and the
// effect are the ground truth written above, from the middleware's
// source; none depends on scheduling, as the middleware never answers
// 409.
func TestThirdPartyFiber(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		cfg       func() *idempotency.Config // nil config: idempotency.New()
		keyHeader string
		truth     map[string]truth
		// coreOK is false for all three: none compares a request with
		// its key's first (mismatch-422, concurrent-mismatch), scopes a
		// key to its caller (scoped-keys) or requires a key
		// (missing-key).
		coreOK bool
		// created is the handler's executions: one each for
		// retry-replay, concurrent, concurrent-mismatch, mismatch-422,
		// reordered-json, header-case, missing-key and the empty key of
		// malformed-key, two each for two-keys and scoped-keys (the
		// second caller's own key; its use of the first caller's is a
		// replay); the careful configurations add quoted-key, bare-key
		// and the non-UTF-8 key of malformed-key.
		created int64
	}{
		{"defaults", func() *idempotency.Config { return nil }, "X-Idempotency-Key", fiberDefaults, false, 12},
		{"careful", func() *idempotency.Config {
			cfg := fiberCarefulConfig()
			return &cfg
		}, "Idempotency-Key", fiberCareful, false, 15},
		{"careful, Next of its own", func() *idempotency.Config {
			cfg := fiberCarefulConfig()
			cfg.Next = func(c *fiber.Ctx) bool { return c.Path() == "/healthz" }
			return &cfg
		}, "Idempotency-Key", fiberCustomNext, false, 15},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ids := slices.Sorted(maps.Keys(c.truth))
			var want []string
			for _, info := range probe.Checks {
				want = append(want, info.ID)
			}
			slices.Sort(want)
			if !slices.Equal(ids, want) {
				t.Fatalf("the ground truth has checks %q; want one row for each of probe.Checks %q", ids, want)
			}

			base, created := fiberAPI(t, c.cfg())
			cfg := fakeConfig(base)
			cfg.KeyHeader = c.keyHeader
			rep := run(t, cfg)

			for _, r := range rep.Checks {
				w := c.truth[r.ID]
				if r.Status != w.status {
					t.Errorf("%s %s: %s\n\twant %s: %s", r.ID, r.Status, r.Reason, w.status, w.why)
				}
				if r.EffectDelta == nil {
					t.Errorf("%s: no effect delta", r.ID)
				} else if d := *r.EffectDelta; d != int64(r.Executions) && d != int64(r.Executions+r.OtherExecutions) {
					t.Errorf("%s: %d executions (%d of the second caller), the effect moved by %d", r.ID, r.Executions, r.OtherExecutions, d)
				}
			}
			if rep.CoreOK != c.coreOK || rep.OK != c.coreOK {
				t.Errorf("core OK %v, OK %v; the ground truth says %v (no profile required)", rep.CoreOK, rep.OK, c.coreOK)
			}
			if n := created.Load(); rep.Effect == nil || rep.Effect.Before != 0 || rep.Effect.After != n || rep.Effect.Expected != n || n != c.created {
				t.Errorf("effect %+v; the handler created %d, want %d", rep.Effect, n, c.created)
			}
			if t.Failed() {
				logReport(t, rep)
			}
		})
	}
}

// fiberAPI serves, on a loopback port until the test ends, a fiber app
// with the idempotency middleware made with cfg (nil: idempotency.New())
// in front of every route: POST /api creates an item (after 20 ms, so that
// duplicates come in flight) and answers 201 {"id": n} with Location
// /items/n and a session cookie of its own; a body with "refuse" is 400
// and one with "fail" 500, both JSON set as the answer's status (the
// handler returns nil); GET /count answers {"count": n}, every caller's
// items. It returns the base URL and the handler's count.
func fiberAPI(t *testing.T, cfg *idempotency.Config) (string, *atomic.Int64) {
	t.Helper()
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	if cfg == nil {
		app.Use(idempotency.New())
	} else {
		app.Use(idempotency.New(*cfg))
	}
	var created atomic.Int64
	app.Post("/api", func(c *fiber.Ctx) error {
		switch body := c.Body(); {
		case bytes.Contains(body, []byte("refuse")):
			return c.Status(fiber.StatusBadRequest).JSON(fiber.Map{"code": "REFUSED"})
		case bytes.Contains(body, []byte("fail")):
			return c.Status(fiber.StatusInternalServerError).JSON(fiber.Map{"code": "UPSTREAM"})
		}
		time.Sleep(20 * time.Millisecond)
		n := created.Add(1)
		c.Cookie(&fiber.Cookie{Name: "session", Value: fmt.Sprintf("s%d", n), HTTPOnly: true})
		c.Location(fmt.Sprintf("/items/%d", n))
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"id": n})
	})
	app.Get("/count", func(c *fiber.Ctx) error {
		return c.JSON(fiber.Map{"count": created.Load()})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- app.Listener(ln) }()
	t.Cleanup(func() {
		if err := app.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), &created
}
