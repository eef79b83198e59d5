package storetest

import (
	"errors"
	"strings"

	"github.com/idemkit/idem"
)

// invalidKeys are keys every store refuses with idem.ErrInvalidKey.
var invalidKeys = map[string]string{
	"empty":           "",
	"256 bytes":       strings.Repeat("k", 256),
	"256 bytes utf8":  strings.Repeat("я", 128),
	"NUL":             "a\x00b",
	"newline":         "a\nb",
	"tab":             "a\tb",
	"carriage":        "a\rb",
	"escape":          "\x1b[31m",
	"DEL":             "a\x7fb",
	"C1 control":      "a\u0085b",
	"bad UTF-8":       "a\xffb",
	"truncated UTF-8": "ключ"[:3],
}

var keyCases = []testCase{
	{name: "KeysValid", run: func(h *harness) {
		keys := map[string]string{
			"utf8":           "ключ-🔑",
			"255 bytes":      strings.Repeat("k", 255),
			"255 bytes utf8": strings.Repeat("я", 127) + "k",
			"255 bytes 4B":   strings.Repeat("🔑", 63) + "kkk",
			"one byte":       "k",
			"replacement":    "\uFFFD",
			"spaces":         " a key with spaces ",
			"separators":     `a:b/c|d{e}f\g"h'i%j*k?l[m]n`,
			"sql":            "'; DROP TABLE idem_records; --",
			"lua":            "]] .. redis.call('FLUSHALL') .. [[",
		}
		for name, key := range keys {
			if err := idem.ValidateKey(key); err != nil {
				h.Fatalf("the %s key %q is not valid for idem.ValidateKey: %v", name, key, err)
			}
			req := h.req(key, "fp", longLease)
			res, err := h.store.Acquire(h.ctx, req)
			if err != nil || res.Outcome != idem.Acquired {
				h.Fatalf("Acquire with the %s key (%d bytes) = %v, %v; want acquired", name, len(key), res.Outcome, err)
			}
			h.checkLease(res.Lease, req)
			rec := h.get(key)
			h.checkHeld(rec, req, res.Lease)
			resp := idem.Response{StatusCode: 200, Body: []byte(name)}
			h.complete(res.Lease, resp)
			h.checkCompleted(h.get(key), "fp", res.Lease, resp, longRetention)
			if err := h.store.Delete(h.ctx, h.scope, key); err != nil {
				h.Fatalf("Delete of the %s key: %v", name, err)
			}
			h.notFound(key)
		}
	}},

	{name: "KeysInvalid", run: func(h *harness) {
		for name, key := range invalidKeys {
			res, err := h.store.Acquire(h.ctx, h.req(key, "fp", longLease))
			if !errors.Is(err, idem.ErrInvalidKey) {
				h.Fatalf("Acquire with the %s key %q = %s, %v; want idem.ErrInvalidKey", name, key, fmtResult(res), err)
			}
			// Nothing was stored: Get refuses the key or finds nothing.
			if _, err := h.store.Get(h.ctx, h.scope, key); err == nil {
				h.Fatalf("Get with the %s key found a record", name)
			}
		}
	}},

	{name: "Scopes", run: func(h *harness) {
		key := strings.ToLower(h.scope) // unique in the empty scope too
		valid := map[string]string{
			"empty":     "",
			"255 bytes": h.scope + strings.Repeat("s", 255-len(h.scope)),
			"utf8":      h.scope + "-тенант-🔑",
		}
		for name, scope := range valid {
			req := idem.AcquireRequest{Scope: scope, Key: key, Fingerprint: "fp", Lease: longLease, Retention: longRetention}
			res, err := h.store.Acquire(h.ctx, req)
			if err != nil || res.Outcome != idem.Acquired {
				h.Fatalf("Acquire in the %s scope = %v, %v; want acquired", name, res.Outcome, err)
			}
			rec, err := h.store.Get(h.ctx, scope, key)
			if err != nil {
				h.Fatalf("Get in the %s scope: %v", name, err)
			}
			h.checkHeld(rec, req, res.Lease)
			if err := h.store.Delete(h.ctx, scope, key); err != nil {
				h.Fatalf("Delete in the %s scope: %v", name, err)
			}
		}
		invalid := map[string]string{
			"256 bytes": h.scope + strings.Repeat("s", 256-len(h.scope)),
			"control":   h.scope + "\n",
			"bad UTF-8": h.scope + "\xff",
		}
		for name, scope := range invalid {
			res, err := h.store.Acquire(h.ctx, idem.AcquireRequest{Scope: scope, Key: "k", Fingerprint: "fp", Lease: longLease, Retention: longRetention})
			if !errors.Is(err, idem.ErrInvalidScope) {
				h.Fatalf("Acquire in the %s scope = %s, %v; want idem.ErrInvalidScope", name, fmtResult(res), err)
			}
		}
	}},

	{name: "ScopesIsolated", run: func(h *harness) {
		a, b := h.scope+"-a", h.scope+"-b"
		reqA := idem.AcquireRequest{Scope: a, Key: "k", Fingerprint: "fp-a", Lease: longLease, Retention: longRetention}
		reqB := idem.AcquireRequest{Scope: b, Key: "k", Fingerprint: "fp-b", Lease: longLease, Retention: longRetention}
		la := h.lease(reqA)
		lb := h.lease(reqB) // not InFlight, not Mismatch: another record
		if la.Fence != 1 || lb.Fence != 1 {
			h.Fatalf("fences %d and %d, want 1 and 1", la.Fence, lb.Fence)
		}
		// A lease of one scope does not touch the other.
		cross := la
		cross.Scope = b
		h.leaseLost("Complete across scopes", h.store.Complete(h.ctx, cross, idem.Response{}, longRetention))
		respA := idem.Response{StatusCode: 200, Body: []byte("a")}
		h.complete(la, respA)
		h.expect(reqB, idem.InFlight)
		respB := idem.Response{StatusCode: 201, Body: []byte("b")}
		h.complete(lb, respB)
		if res := h.expect(reqA, idem.Completed); diffResponse(res.Record.Response, respA) != "" {
			h.Fatalf("scope a replays %+v", res.Record.Response)
		}
		if res := h.expect(reqB, idem.Completed); diffResponse(res.Record.Response, respB) != "" {
			h.Fatalf("scope b replays %+v", res.Record.Response)
		}
		if err := h.store.Delete(h.ctx, a, "k"); err != nil {
			h.Fatalf("Delete: %v", err)
		}
		if _, err := h.store.Get(h.ctx, a, "k"); !errors.Is(err, idem.ErrNotFound) {
			h.Fatalf("Get of the deleted record = %v, want idem.ErrNotFound", err)
		}
		if rec, err := h.store.Get(h.ctx, b, "k"); err != nil || rec.Status != idem.StatusCompleted {
			h.Fatalf("deleting scope a's record touched scope b's: %s, %v", fmtRecord(rec), err)
		}

		// A store that joins scope and key with a separator must not let
		// ("x:y", "z") meet ("x", "y:z").
		for _, sep := range []string{":", "/", "|", "{", "}", " ", "\\", "%", "."} {
			s1 := h.scope + "-sep" + sep + "y"
			s2 := h.scope + "-sep"
			k1 := "z"
			k2 := "y" + sep + "z"
			r1 := idem.AcquireRequest{Scope: s1, Key: k1, Fingerprint: "one", Lease: longLease, Retention: longRetention}
			r2 := idem.AcquireRequest{Scope: s2, Key: k2, Fingerprint: "two", Lease: longLease, Retention: longRetention}
			h.lease(r1)
			if res := h.acquire(r2); res.Outcome != idem.Acquired {
				h.Fatalf("(%q, %q) and (%q, %q) are one record: %v; %s", s1, k1, s2, k2, res.Outcome, fmtResult(res))
			}
			// And the same the other way round, for the empty scope.
			r3 := idem.AcquireRequest{Scope: "", Key: s2 + sep + k2, Fingerprint: "three", Lease: longLease, Retention: longRetention}
			if res := h.acquire(r3); res.Outcome != idem.Acquired {
				h.Fatalf("(%q, %q) meets another record: %v; %s", "", r3.Key, res.Outcome, fmtResult(res))
			}
			if err := h.store.Delete(h.ctx, "", r3.Key); err != nil {
				h.Fatalf("Delete: %v", err)
			}
		}
	}},
}
