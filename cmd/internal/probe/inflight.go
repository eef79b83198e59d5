package probe

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// checkConcurrentMismatch sends -n requests with one key at once, half
// with the body and half with another (the one the mismatch check found
// the API accepts): one executes, its body's others replay it or get
// 409, the other body's get 409 or 422 (or, when the API accepts no other
// body on its own, the refusal it got under a fresh key).
func checkConcurrentMismatch(ctx context.Context, c *check) (Status, string, error) {
	n := c.p.cfg.Concurrency
	key := c.p.newKey()
	other := otherBody(c.p.cfg.Body, c.p.cfg.Header.Get("Content-Type"), c.p.runID)
	// refusedAlone holds the statuses the other bodies got under a fresh
	// key when the API accepted none: the same answer under this key is
	// the body's refusal, not the key's.
	refusedAlone := map[int]bool{}
	if st := c.p.mismatch; st != nil {
		if st.body != nil {
			other = st.body
		} else {
			for _, a := range st.refused {
				if a.err == nil && a.status >= 400 && a.status <= 499 {
					refusedAlone[a.status] = true
				}
			}
		}
	}
	bodies := [2][]byte{c.p.cfg.Body, other}
	answers := c.sendAtOnce(ctx, n, func(i int) request {
		rq := c.keyed(key)
		rq.body = bodies[i%2]
		return rq
	})

	var got [2][]*answer // per body, the answers other than 409 and 422
	var conflicts, refused [2]int
	alone := 0 // the other body's answers that are its refusal under any key
	var bad []string
	for i, a := range answers {
		b := i % 2
		switch {
		case a.err != nil:
			bad = append(bad, fmt.Sprintf("request %d: %s", i+1, a))
		case b == 1 && refusedAlone[a.status]:
			alone++
		case a.status == http.StatusConflict:
			conflicts[b]++
			c.p.noteInFlight("a duplicate sent while the first ran", a)
		case a.status == http.StatusUnprocessableEntity:
			refused[b]++
			c.p.noteRefusal("another body while the first ran", a)
		default:
			got[b] = append(got[b], a)
		}
	}
	if len(bad) > 0 {
		return Fail, fmt.Sprintf("%d of %d requests got no answer: %s", len(bad), n, strings.Join(first3(bad), "; ")), nil
	}
	names := [2]string{"the body", "the other body"}
	switch {
	case len(got[0]) > 0 && len(got[1]) > 0:
		x, y := got[0][0], got[1][0]
		if x.same(y) || y.replayed() {
			return Fail, fmt.Sprintf("the other body, sent while the body ran under its key, got the body's answer (%s): the API does not compare a request in flight with the key's", y), nil
		}
		return Fail, fmt.Sprintf("both bodies were answered under one key at once: the body got %s, the other body %s (neither 409 nor 422)", x, y), nil
	case len(got[0]) == 0 && len(got[1]) == 0:
		return Fail, fmt.Sprintf("no request executed: %d got 409 and %d got 422", conflicts[0]+conflicts[1], refused[0]+refused[1]), nil
	}
	w := 0
	if len(got[0]) == 0 {
		w = 1
	}
	exec := got[w][0]
	for _, a := range got[w] {
		if !a.replayed() {
			exec = a
			break
		}
	}
	for _, a := range got[w] {
		if !a.same(exec) {
			return Fail, fmt.Sprintf("%s was answered twice otherwise under one key: %s and %s", names[w], exec, a), nil
		}
	}
	l := 1 - w
	reason := fmt.Sprintf("%d requests, two bodies, one key: %s was answered once (%s), %d of its duplicates replayed, %d got 409; %s got %d × 409, %d × 422",
		n, names[w], statusText(exec.status), len(got[w])-1, conflicts[w], names[l], conflicts[l], refused[l])
	if alone > 0 {
		reason += fmt.Sprintf(", %d × the refusal it gets under any key (the API accepts none of the other bodies the probe makes)", alone)
	}
	return Pass, reason, nil
}

// checkRetryAfter judges the 409s of the concurrent checks: each carries
// Retry-After.
func checkRetryAfter(ctx context.Context, c *check) (Status, string, error) {
	p := c.p
	if len(p.inFlight) == 0 {
		return NotApplicable, "no request got 409: the API waited and replayed, or each first request ended before its duplicates came", nil
	}
	missing := 0
	for _, a := range p.inFlight {
		v := a.header.Get("Retry-After")
		switch {
		case v == "":
			missing++
		case !validRetryAfter(v):
			return Fail, fmt.Sprintf("a 409 carried Retry-After %q, neither seconds nor an HTTP date", v), nil
		}
	}
	if missing > 0 {
		return Fail, fmt.Sprintf("%d of %d 409s carried no Retry-After: a client cannot tell when the first request may be done (%s)", missing, len(p.inFlight), retryAfterText(p.inFlight)), nil
	}
	return Pass, fmt.Sprintf("%d 409s carried %s; the executing request took %v", len(p.inFlight), retryAfterText(p.inFlight), roundTook(p.execTime)), nil
}

// validRetryAfter reports whether v is a Retry-After value: delay-seconds
// or an HTTP date (RFC 9110 §10.2.3).
func validRetryAfter(v string) bool {
	if _, err := strconv.ParseUint(v, 10, 63); err == nil {
		return true
	}
	_, err := http.ParseTime(v)
	return err == nil
}
