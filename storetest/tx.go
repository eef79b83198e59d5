package storetest

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idem"
)

// completeTx runs CompleteTx in a new transaction and then commits it, or
// rolls it back when commit is false. It returns CompleteTx's error (the
// transaction is rolled back then).
func (h *harness) completeTx(l idem.Lease, resp idem.Response, commit bool) error {
	h.Helper()
	tx := h.beginTx()
	if err := h.store.(idem.TxCompleter).CompleteTx(h.ctx, tx, l, resp, longRetention); err != nil {
		_ = tx.Rollback()
		return err
	}
	h.endTx(tx, commit)
	return nil
}

func (h *harness) beginTx() *sql.Tx {
	h.Helper()
	tx, err := h.caps.BeginTx(h.ctx)
	if err != nil {
		h.Fatalf("Caps.BeginTx: %v", err)
	}
	h.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func (h *harness) endTx(tx *sql.Tx, commit bool) {
	h.Helper()
	if commit {
		if err := tx.Commit(); err != nil {
			h.Fatalf("Commit: %v", err)
		}
		return
	}
	if err := tx.Rollback(); err != nil {
		h.Fatalf("Rollback: %v", err)
	}
}

func (h *harness) guard() *idem.Guard {
	h.Helper()
	g, err := idem.NewGuard(h.store, &idem.GuardConfig{Lease: longLease, Retention: longRetention})
	if err != nil {
		h.Fatalf("NewGuard: %v", err)
	}
	return g
}

var txCases = []testCase{
	{name: "CompleteTxCommit", tx: true, run: func(h *harness) {
		req := h.req("k", "fp", longLease)
		l := h.lease(req)
		resp := idem.Response{StatusCode: 201, Header: map[string][]string{"Location": {"/orders/1"}}, Body: []byte{0, 1, 2, 255}}
		if err := h.completeTx(l, resp, true); err != nil {
			h.Fatalf("CompleteTx: %v", err)
		}
		rec := h.get("k")
		h.checkCompleted(rec, "fp", l, resp, longRetention)
		h.expect(req, idem.Completed)
		// A retry of the completion outside the transaction finds it done.
		if err := h.store.Complete(h.ctx, l, idem.Response{}, longRetention); err != nil {
			h.Fatalf("Complete after a committed CompleteTx = %v, want nil", err)
		}
		h.unchanged("k", rec, "Complete after a committed CompleteTx")
	}},

	{name: "CompleteTxRollback", tx: true, run: func(h *harness) {
		req := h.req("k", "fp", longLease)
		l := h.lease(req)
		before := h.get("k")
		if err := h.completeTx(l, idem.Response{StatusCode: 200, Body: []byte("rolled back")}, false); err != nil {
			h.Fatalf("CompleteTx: %v", err)
		}
		h.unchanged("k", before, "a rolled back CompleteTx")
		h.expect(req, idem.InFlight)
		resp := idem.Response{StatusCode: 200, Body: []byte("after rollback")}
		h.complete(l, resp)
		h.checkCompleted(h.get("k"), "fp", l, resp, longRetention)
	}},

	{name: "CompleteTxLeaseLost", tx: true, run: func(h *harness) {
		req := h.req("k", "fp", shortLease)
		stale := h.lease(req)
		h.sleepPast(shortLease)
		req.Lease = longLease
		won := h.expect(req, idem.Acquired).Lease
		before := h.get("k")
		for name, l := range map[string]idem.Lease{"stale fence": stale, "another owner": func() idem.Lease { l := won; l.Owner = idem.NewOwner(); return l }()} {
			h.leaseLost("CompleteTx with "+name, h.completeTx(l, idem.Response{StatusCode: 500}, true))
			h.unchanged("k", before, "CompleteTx with "+name)
		}
		if err := h.completeTx(won, idem.Response{StatusCode: 200}, true); err != nil {
			h.Fatalf("winner's CompleteTx: %v", err)
		}
		missing := idem.Lease{Scope: h.scope, Key: "never", Owner: idem.NewOwner(), Fence: 1}
		h.leaseLost("CompleteTx of a missing record", h.completeTx(missing, idem.Response{}, true))
	}},

	{name: "CompleteTxTwice", tx: true, run: func(h *harness) {
		// The completion committed already: a second CompleteTx with the
		// same lease must not let the caller commit its effect again.
		// Complete would succeed (it changes nothing); CompleteTx fails
		// with idem.ErrFinished, and the record keeps the first response.
		first := idem.Response{StatusCode: 201, Body: []byte("first")}
		var l idem.Lease
		for key, complete := range map[string]func(l idem.Lease) error{
			"by-tx":    func(l idem.Lease) error { return h.completeTx(l, first, true) },
			"by-plain": func(l idem.Lease) error { return h.store.Complete(h.ctx, l, first, longRetention) },
		} {
			l = h.lease(h.req(key, "fp", longLease))
			if err := complete(l); err != nil {
				h.Fatalf("first completion of %s: %v", key, err)
			}
			before := h.get(key)
			err := h.completeTx(l, idem.Response{StatusCode: 201, Body: []byte("second")}, true)
			if !errors.Is(err, idem.ErrFinished) || errors.Is(err, idem.ErrLeaseLost) {
				h.Fatalf("CompleteTx of a record this lease completed (%s) = %v, want idem.ErrFinished (not ErrLeaseLost)", key, err)
			}
			h.unchanged(key, before, "a second CompleteTx")
		}
		// Another lease on a completed record is still "lease lost".
		other := l
		other.Owner = idem.NewOwner()
		h.leaseLost("CompleteTx of a completed record with another owner", h.completeTx(other, first, true))
	}},

	{name: "GuardCompleteTxCommit", tx: true, run: func(h *harness) {
		g := h.guard()
		exec, res, err := g.Begin(h.ctx, h.scope, "k", "fp")
		if err != nil || exec == nil {
			h.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		resp := idem.Response{StatusCode: 201, Body: []byte("committed")}
		tx := h.beginTx()
		if err := exec.CompleteTx(h.ctx, tx, resp); err != nil {
			h.Fatalf("Execution.CompleteTx: %v", err)
		}
		h.endTx(tx, true)
		got, ok, err := exec.Committed(h.ctx)
		if err != nil || !ok {
			h.Fatalf("Committed = %v, %v after a commit; want true", ok, err)
		}
		if d := diffResponse(&got, resp); d != "" {
			h.Fatalf("Committed response: %s", d)
		}
		h.checkCompleted(h.get("k"), "fp", exec.Lease(), resp, longRetention)
		if err := exec.Complete(h.ctx, resp); !errors.Is(err, idem.ErrFinished) {
			h.Fatalf("Complete after Committed = %v, want idem.ErrFinished", err)
		}
	}},

	{name: "GuardCompleteTxRollback", tx: true, run: func(h *harness) {
		g := h.guard()
		exec, res, err := g.Begin(h.ctx, h.scope, "k", "fp")
		if err != nil || exec == nil {
			h.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		tx := h.beginTx()
		if err := exec.CompleteTx(h.ctx, tx, idem.Response{StatusCode: 200, Body: []byte("rolled back")}); err != nil {
			h.Fatalf("Execution.CompleteTx: %v", err)
		}
		h.endTx(tx, false)
		if _, ok, err := exec.Committed(h.ctx); err != nil || ok {
			h.Fatalf("Committed = %v, %v after a rollback; want false, nil", ok, err)
		}
		if rec := h.get("k"); rec.Status != idem.StatusProcessing {
			h.Fatalf("after a rollback the record is %s, want processing", fmtRecord(rec))
		}
		// The execution is still open: it may complete another way.
		resp := idem.Response{StatusCode: 200, Body: []byte("retried")}
		if err := exec.Complete(h.ctx, resp); err != nil {
			h.Fatalf("Complete after a rollback: %v", err)
		}
		h.checkCompleted(h.get("k"), "fp", exec.Lease(), resp, longRetention)
	}},

	{name: "GuardDoCompleteTx", tx: true, run: func(h *harness) {
		g := h.guard()
		stored := idem.Response{StatusCode: 201, Body: []byte("in the transaction")}
		work := func(ctx context.Context) (idem.Response, error) {
			tx, err := h.caps.BeginTx(ctx)
			if err != nil {
				return idem.Response{}, err
			}
			defer func() { _ = tx.Rollback() }()
			if err := idem.FromContext(ctx).CompleteTx(ctx, tx, stored); err != nil {
				return idem.Response{}, err
			}
			if err := tx.Commit(); err != nil {
				return idem.Response{}, err
			}
			return idem.Response{StatusCode: 299, Body: []byte("not what was stored")}, nil
		}
		got, replayed, err := g.Do(h.ctx, h.scope, "k", "fp", work)
		if err != nil || replayed || diffResponse(&got, stored) != "" {
			h.Fatalf("Do = %+v, replayed %v, %v; want the committed response, not replayed", got, replayed, err)
		}
		got, replayed, err = g.Do(h.ctx, h.scope, "k", "fp", func(context.Context) (idem.Response, error) {
			h.Error("work ran again")
			return idem.Response{}, nil
		})
		if err != nil || !replayed || diffResponse(&got, stored) != "" {
			h.Fatalf("second Do = %+v, replayed %v, %v; want a replay of the committed response", got, replayed, err)
		}
	}},
}
