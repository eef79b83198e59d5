package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// checkReleased5xx sends the -d5xx body under a key twice, then the
// accepted body under the same key: it must execute, the failure let go.
func checkReleased5xx(ctx context.Context, c *check) (Status, string, error) {
	p := c.p
	if p.cfg.ServerErrorBody == nil {
		return NotApplicable, "give -d5xx with a body the API answers with a 5xx (a provider that fails, say) to check that failures are not kept", nil
	}
	key := p.newKey()
	rq := c.keyed(key)
	rq.body = p.cfg.ServerErrorBody
	first := c.settle(ctx, rq)
	if first.err != nil || first.status < 500 || first.status > 599 {
		return Fail, "the -d5xx body got " + first.String() + "; give -d5xx a body the API answers with a 5xx", nil
	}
	again := c.settle(ctx, rq)
	if again.replayed() {
		return Fail, "the retry of the " + statusText(first.status) + " got it replayed (" + markerText(again) + "): the failure is kept, and a client that retries as told never gets through", nil
	}
	a := c.settle(ctx, c.keyed(key))
	switch {
	case a.ok() && !a.replayed() && !(a.status == first.status && a.sameBody(first)):
		return Pass, "the -d5xx body got " + statusText(first.status) + ", and so did its retry; the accepted body under the same key then executed (" + statusText(a.status) + "): the failure was let go", nil
	case a.err == nil && a.status == http.StatusUnprocessableEntity:
		return Fail, "after the " + statusText(first.status) + ", the accepted body under the same key got 422: the key still holds the failed request, so its retries get the failure for the record's lifetime", nil
	case a.replayed() || a.same(first):
		return Fail, "after the " + statusText(first.status) + ", the accepted body under the same key got the failure replayed: it is kept for the record's lifetime", nil
	default:
		return Fail, "after the " + statusText(first.status) + ", the accepted body under the same key got " + a.String() + ", where a key let go executes it", nil
	}
}

// checkProblemDetails judges the refusals of keys the other checks got.
func checkProblemDetails(ctx context.Context, c *check) (Status, string, error) {
	p := c.p
	p.mu.Lock()
	refusals := slices.Clone(p.refusals)
	p.mu.Unlock()
	if len(refusals) == 0 {
		return NotApplicable, "no key was refused with 400, 409 or 422", nil
	}
	byStatus := map[int]int{}
	for _, r := range refusals {
		if msg := problemError(r.a); msg != "" {
			return Fail, r.what + " got " + statusText(r.a.status) + ": " + msg, nil
		}
		byStatus[r.a.status]++
	}
	var parts []string
	for _, s := range []int{http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity} {
		if byStatus[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d × %d", byStatus[s], s))
		}
	}
	return Pass, fmt.Sprintf("%d refusals (%s) were application/problem+json objects with their status", len(refusals), strings.Join(parts, ", ")), nil
}

// problemError says how a is not an RFC 9457 problem detail; "" when it
// is one.
func problemError(a *answer) string {
	ct := a.header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/problem+json" {
		if ct == "" {
			return "no Content-Type, not application/problem+json"
		}
		return fmt.Sprintf("Content-Type %q, not application/problem+json", ct)
	}
	if a.size > int64(len(a.body)) {
		return fmt.Sprintf("the body is %d bytes, more than a problem detail takes", a.size)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(a.body, &m); err != nil || m == nil {
		return "the body is not a JSON object: " + excerpt(a.body)
	}
	if raw, ok := m["status"]; ok && strings.TrimSpace(string(raw)) != strconv.Itoa(a.status) {
		return fmt.Sprintf("its status member is %s, not the number %d", raw, a.status)
	}
	for _, name := range []string{"type", "title", "detail", "instance"} {
		if raw, ok := m[name]; ok {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return fmt.Sprintf("its %s member is %s, not a string", name, raw)
			}
		}
	}
	return ""
}
