package probe

import (
	"context"
	"fmt"
	"time"
)

// expiryState is the expiry check's first request.
type expiryState struct {
	key      string
	first    *answer
	answered time.Time // when its answer had come
	sent     time.Time // when it was sent
}

// startExpiry sends the expiry check's key, when Config.Retention is set.
func startExpiry(ctx context.Context, c *check) error {
	p := c.p
	if p.cfg.Retention == 0 {
		return nil
	}
	key := p.newKey()
	sent := time.Now()
	first := c.settle(ctx, c.keyed(key))
	p.expiry = &expiryState{key: key, first: first, sent: sent, answered: time.Now()}
	return ctx.Err()
}

// checkExpiry sends the key again before the retention ends (a replay)
// and after it (an execution).
func checkExpiry(ctx context.Context, c *check) (Status, string, error) {
	p := c.p
	st := p.expiry
	ret := p.cfg.Retention
	if st == nil {
		return NotApplicable, "give -retention with the retention the API documents (24h) to check that a key executes again after it; the run then lasts that long", nil
	}
	if !st.first.ok() {
		return Fail, "the key's first request got " + st.first.String(), nil
	}
	// Before: the record was made after the request was sent, so it lives
	// at least until sent + retention. The key is sent again as close to
	// that as a request arrives for sure: a second (a store that counts
	// whole seconds) and twice the first request's time before it, or a
	// hundredth of the retention when that is more, never before four
	// fifths of it. A record that ends early by more is caught.
	slack := min(ret/5, max(time.Second+2*(st.answered.Sub(st.sent)), ret/100))
	if err := sleepUntil(ctx, st.sent.Add(ret-slack)); err != nil {
		return "", "", err
	}
	before := c.settle(ctx, c.keyed(st.key))
	if !before.replayed() && !st.first.same(before) {
		return Fail, fmt.Sprintf("%v after the key's first request, within the retention of %v, it got %s; its first answer was %s: the record ended early, and a late retry executes twice",
			roundTook(time.Since(st.sent)), ret, before, st.first), nil
	}
	// After: the record was made before its answer came, so it has ended
	// by answered + retention; a second more for stores that count whole
	// seconds.
	due := st.answered.Add(ret + time.Second)
	deadline := due.Add(max(5*time.Second, ret/10))
	step := min(max(250*time.Millisecond, ret/20), 5*time.Second)
	if err := sleepUntil(ctx, due); err != nil {
		return "", "", err
	}
	for {
		var n0 int64
		if p.effectOn {
			n, err := p.count(ctx)
			if err != nil {
				return "", "", err
			}
			n0 = n
		}
		execs := c.executions
		a := c.settle(ctx, c.keyed(st.key))
		executed, known := false, true
		switch {
		case a.replayed():
		case p.effectOn:
			n1, err := p.count(ctx)
			if err != nil {
				return "", "", err
			}
			executed = n1 > n0
			if executed && c.executions == execs {
				// The same bytes as the first answer, but the effect moved:
				// an execution all the same.
				c.mu.Lock()
				c.executions++
				c.mu.Unlock()
			}
		case a.ok() && !st.first.same(a):
			executed = true
		case a.ok():
			known = false
		default:
			return Fail, fmt.Sprintf("after the retention of %v the key got %s", ret, a), nil
		}
		late := roundTook(time.Since(st.answered) - ret)
		switch {
		case executed:
			return Pass, fmt.Sprintf("the key replayed within the retention of %v and executed again %v after it (%s)", ret, late, statusText(a.status)), nil
		case !known:
			return Warning, fmt.Sprintf("%v after the retention of %v the key got the first answer's bytes, unmarked: an execution cannot be told from a replay without -effect-url", late, ret), nil
		case time.Now().After(deadline):
			return Warning, fmt.Sprintf("%v after the retention of %v the key still replayed its first answer: records outlive the retention given (harmless to idempotency, but the documented retention is not the API's)", late, ret), nil
		}
		if err := sleepUntil(ctx, time.Now().Add(step)); err != nil {
			return "", "", err
		}
	}
}

// sleepUntil waits until t or the context's end.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
