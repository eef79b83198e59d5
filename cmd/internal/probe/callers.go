package probe

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// otherKey is the key under which the second caller's answers to key are
// counted: apart from the first caller's.
func otherKey(key string) string { return "\x00other\x00" + key }

// checkScoped sends a key as the first caller, then as the second: the
// second must not get the first's answer.
func checkScoped(ctx context.Context, c *check) (Status, string, error) {
	p := c.p
	if p.cfg.OtherHeader == nil {
		return NotApplicable, "give -H2 with the headers of a second caller (its credentials or identity) to check that one caller's key never replays another's answer", nil
	}
	asOther := func(key string) request {
		rq := c.keyed(key)
		rq.other, rq.key = true, otherKey(key)
		return rq
	}
	key := p.newKey()
	first := c.settle(ctx, c.keyed(key))
	if !first.ok() {
		return Fail, "the first caller's request with a fresh key got " + first.String(), nil
	}
	// The second caller's effect is read as the second caller; when the
	// effect is the first caller's alone (a URL that names it), as the
	// first caller, whose count the second caller's executions may not
	// move: the answers then judge.
	var before int64
	otherReads := true
	if p.effectOn {
		n, err := p.countAs(ctx, true)
		if err != nil {
			otherReads = false
			if n, err = p.countAs(ctx, false); err != nil {
				return "", "", err
			}
		}
		before = n
	}
	own := c.settle(ctx, asOther(p.newKey()))
	if !own.ok() {
		return NotApplicable, "the second caller's request with a key of its own got " + own.String() + "; give -H2 headers the API accepts", nil
	}
	b := c.settle(ctx, asOther(key))
	switch {
	case b.replayed():
		return Fail, "the second caller, sending the first caller's key, got a replay (" + b.String() + ")" + sharedPrivate(first, own, b) + ": keys are not scoped to the caller, and one caller's answer reaches another", nil
	case b.err == nil && b.status >= 400 && b.status <= 499:
		// Refused (409, 422, or a 403 or 400 that says the key is
		// another caller's), where its own key was taken: nothing of the
		// first caller's reached it.
		return Warning, "the second caller, sending the first caller's key, got " + statusText(b.status) + ", where its own key executed: the key space is shared between callers; nothing leaked, but one caller can block another's key", nil
	case !b.ok():
		return Fail, "the second caller, sending the first caller's key, got " + b.String(), nil
	}
	bRetry := c.settle(ctx, asOther(key))
	leak := b.same(first)
	byEffect := false // the effect judged whether b executed
	if p.effectOn {
		after, err := p.countAs(ctx, otherReads)
		if err != nil {
			return "", "", err
		}
		switch moved := after - before; {
		case !otherReads && moved == 0:
			// Read as the first caller, and not moved by the second
			// caller's executions: the count is the first caller's alone,
			// and the answers judge.
		case moved == int64(c.other):
			leak, byEffect = false, true
		case moved == int64(c.other)-1:
			// b did not execute: it was the first caller's answer.
			c.mu.Lock()
			c.other--
			c.mu.Unlock()
			return Fail, fmt.Sprintf("the second caller, sending the first caller's key, got %s%s, and its effect did not move: it got the first caller's answer", b, sharedPrivate(first, own, b)), nil
		default:
			return Fail, fmt.Sprintf("the second caller's effect moved by %d where its answers show %s", moved, executionsText(c.other)), nil
		}
	}
	if !byEffect && leak && own.same(first) {
		how := "give -effect-url"
		if p.effectOn {
			how = "the effect, which the second caller cannot read, counts the first caller's alone"
		}
		return Warning, "the second caller, sending the first caller's key, got the same bytes as the first caller; the answers carry no ids, so an execution cannot be told from a leaked replay: " + how, nil
	}
	if leak {
		// b was the first caller's answer, not an execution.
		c.mu.Lock()
		c.other--
		c.mu.Unlock()
		return Fail, "the second caller, sending the first caller's key, got the first caller's answer byte for byte (" + first.String() + ")" + sharedPrivate(first, own, b) + ", where its own key got an answer of its own: keys are not scoped to the caller", nil
	}
	if !b.same(bRetry) {
		return Fail, "the second caller's retry of the key got " + bRetry.String() + "; its first answer was " + b.String() + ": the key is not guarded for the second caller", nil
	}
	a := c.settle(ctx, c.keyed(key))
	if !first.same(a) {
		return Fail, "the first caller's retry, after the second caller used its key, got " + a.String() + "; its first answer was " + first.String(), nil
	}
	return Pass, "the second caller, sending the first caller's key, executed on its own (" + statusText(b.status) + "), and each caller's retry replayed its own answer", nil
}

// sharedPrivate says which private headers of first the leaked answer b
// carried too, and own (the second caller's own execution) did not (""
// when none): the first caller's session handed to the second.
func sharedPrivate(first, own, b *answer) string {
	fv, ov := privateValues(first), privateValues(own)
	var names []string
	for _, v := range privateValues(b) {
		if slices.Contains(fv, v) && !slices.Contains(ov, v) && !slices.Contains(names, shown(v)) {
			names = append(names, shown(v))
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " with the first caller's " + strings.Join(names, ", ")
}

// privateHeaders are the response headers that belong to the caller an
// answer was made for.
var privateHeaders = []string{"Set-Cookie", "Set-Cookie2", "Authentication-Info", "Proxy-Authentication-Info"}

// privateValues returns the private headers of a: for a cookie its
// name=value (attributes aside), for others the value; each is prefixed
// by its header's name. Cookies folded into one Set-Cookie line (as a
// store that keeps each header as one string replays them) are each
// taken: a cookie's value holds no comma, so each comma-separated piece
// that starts with name=value is a cookie (the pieces an Expires date
// splits off hold no = before their first ;).
func privateValues(a *answer) []string {
	if a == nil || a.err != nil {
		return nil
	}
	var out []string
	for _, h := range privateHeaders {
		for _, v := range a.header.Values(h) {
			if !strings.HasPrefix(h, "Set-Cookie") {
				out = append(out, h+": "+strings.TrimSpace(v))
				continue
			}
			for _, piece := range strings.Split(v, ",") {
				pair, _, _ := strings.Cut(piece, ";")
				pair = strings.TrimSpace(pair)
				if name, _, ok := strings.Cut(pair, "="); ok && isToken(strings.TrimSpace(name)) {
					out = append(out, h+": "+pair)
				}
			}
		}
	}
	return out
}

// shown returns a private value with its secret part hidden.
func shown(v string) string {
	h, rest, _ := strings.Cut(v, ": ")
	name, _, ok := strings.Cut(rest, "=")
	if strings.HasPrefix(h, "Set-Cookie") && ok {
		return h + " " + name + "=…"
	}
	return h
}

// checkPrivateHeaders judges every replay of the run: none carries a
// private header its first answer set and not every first answer sets.
func checkPrivateHeaders(ctx context.Context, c *check) (Status, string, error) {
	p := c.p
	p.mu.Lock()
	defer p.mu.Unlock()
	firsts := map[string]*answer{}
	carriers := map[string]int{} // private value → the keys whose first answer set it
	for _, k := range p.keys {
		for _, a := range p.log[k] {
			if a.err == nil && a.status != http.StatusConflict && a.status != http.StatusUnprocessableEntity {
				firsts[k] = a
				break
			}
		}
		set := map[string]bool{}
		for _, v := range privateValues(firsts[k]) {
			if !set[v] {
				set[v] = true
				carriers[v]++
			}
		}
	}
	if len(carriers) == 0 {
		return NotApplicable, "no answer set a cookie or Authentication-Info: nothing of a caller's to replay", nil
	}
	setters, replays := 0, 0
	for _, k := range p.keys {
		f := firsts[k]
		if f == nil {
			continue
		}
		fv := privateValues(f)
		if len(fv) > 0 {
			setters++
		}
		for _, a := range p.log[k] {
			if a == f || a.err != nil || !(a.replayed() || a.same(f)) {
				continue
			}
			replays++
			for _, v := range privateValues(a) {
				if carriers[v] == 1 && slices.Contains(fv, v) {
					return Fail, fmt.Sprintf("a replay (%s) carried the %s that the answer it replays set, and no other execution's answer: a retry gets another request's session or credentials", statusText(a.status), shown(v)), nil
				}
			}
		}
	}
	if replays == 0 {
		return NotApplicable, fmt.Sprintf("%d answers set a cookie or Authentication-Info, but no answer was a replay", setters), nil
	}
	return Pass, fmt.Sprintf("%d answers set a cookie or Authentication-Info; none of the %d replays carried one an execution set for itself", setters, replays), nil
}
