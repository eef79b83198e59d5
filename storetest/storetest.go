package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Caps says what a store offers beyond idem.Store. Run skips, with the
// reason, the cases of a capability the store lacks.
type Caps struct {
	// BeginTx, when set, enables the CompleteTx cases; it begins a
	// transaction on the database the store writes to. The store must then
	// implement idem.TxCompleter.
	BeginTx func(ctx context.Context) (*sql.Tx, error)
	// Precision is the store clock's granularity (e.g. time.Millisecond for
	// SQL or Redis): times the store computes from one another (ExpiresAt
	// from LeaseUntil and Retention) may differ from the exact sum by up to
	// twice this much. Zero means 1 ms.
	Precision time.Duration
}

// Run runs the conformance suite against the stores newStore returns. It
// calls newStore once per case; newStore may return the same store every
// time. Run returns when every case has finished.
func Run(t *testing.T, newStore func(t *testing.T) idem.Store, caps Caps) {
	t.Helper()
	if newStore == nil {
		t.Fatal("storetest.Run: newStore is nil")
	}
	if caps.Precision <= 0 {
		caps.Precision = time.Millisecond
	}
	all := slices.Concat(acquireCases, raceCases, leaseCases, getDeleteCases, deleteIfCases, dataCases, keyCases, sweepCases, txCases, guardCases)
	// Sweep removes expired records of every scope, including the short
	// lived ones other cases are about to look at: the sweeping cases run
	// first, alone.
	t.Run("serial", func(t *testing.T) {
		for _, c := range all {
			if c.serial {
				t.Run(c.name, func(t *testing.T) { c.exec(t, newStore, caps) })
			}
		}
	})
	t.Run("parallel", func(t *testing.T) {
		for _, c := range all {
			if !c.serial {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.exec(t, newStore, caps)
				})
			}
		}
	})
}

// testCase is one case of the suite.
type testCase struct {
	name     string
	serial   bool // calls Sweep: runs alone, before the others
	tx       bool // needs Caps.BeginTx and an idem.TxCompleter
	deleteIf bool // needs an idem.ConditionalDeleter
	run      func(h *harness)
}

func (c testCase) exec(t *testing.T, newStore func(t *testing.T) idem.Store, caps Caps) {
	if c.tx && caps.BeginTx == nil {
		t.Skip("Caps.BeginTx is nil: the store does not complete inside a caller's transaction")
	}
	s := newStore(t)
	if s == nil {
		t.Fatal("newStore returned nil")
	}
	if c.tx {
		if _, ok := s.(idem.TxCompleter); !ok {
			t.Fatalf("Caps.BeginTx is set but %T does not implement idem.TxCompleter", s)
		}
	}
	if c.deleteIf {
		if _, ok := s.(idem.ConditionalDeleter); !ok {
			t.Skipf("%T does not implement idem.ConditionalDeleter: it cannot delete a record only while it is the one read", s)
		}
	}
	c.run(&harness{T: t, ctx: t.Context(), store: s, caps: caps, scope: uniqueScope(c.name)})
}

// Durations the cases use.
const (
	longLease      = time.Minute
	longRetention  = time.Hour
	shortLease     = 150 * time.Millisecond
	shortRetention = 150 * time.Millisecond
	// skew bounds the difference between the store's clock and the test's.
	skew = 2 * time.Second
)

// uniqueScope returns a scope no other case or run uses.
func uniqueScope(name string) string {
	return "storetest:" + name + ":" + strings.ToLower(rand.Text()[:16])
}

// harness is one case's view of the store: its own scope, and helpers that
// fail the case with a clear message.
type harness struct {
	*testing.T
	ctx   context.Context
	store idem.Store
	caps  Caps
	scope string
}

// tol is how far apart two times the store derives from each other may be.
func (h *harness) tol() time.Duration { return 2 * h.caps.Precision }

// sleepPast sleeps until a lease or retention of d that started before the
// call has surely ended on the store's clock.
func (h *harness) sleepPast(d time.Duration) {
	time.Sleep(d + 100*time.Millisecond + 2*h.caps.Precision)
}

func (h *harness) req(key string, fp idem.Fingerprint, lease time.Duration) idem.AcquireRequest {
	return idem.AcquireRequest{Scope: h.scope, Key: key, Fingerprint: fp, Lease: lease, Retention: longRetention}
}

func (h *harness) acquire(req idem.AcquireRequest) idem.AcquireResult {
	h.Helper()
	res, err := h.store.Acquire(h.ctx, req)
	if err != nil {
		h.Fatalf("Acquire(%q, fp %q): %v", req.Key, req.Fingerprint, err)
	}
	return res
}

// expect acquires and fails the case unless the outcome is want.
func (h *harness) expect(req idem.AcquireRequest, want idem.Outcome) idem.AcquireResult {
	h.Helper()
	res := h.acquire(req)
	if res.Outcome != want {
		h.Fatalf("Acquire(%q, fp %q) = %v, want %v; %s", req.Key, req.Fingerprint, res.Outcome, want, fmtResult(res))
	}
	if want == idem.Acquired {
		h.checkLease(res.Lease, req)
		h.checkAcquiredRecord(res, req)
	}
	return res
}

// checkAcquiredRecord checks the Record of an Acquired result: the
// processing record the lease holds, field for field what Get returns.
func (h *harness) checkAcquiredRecord(res idem.AcquireResult, req idem.AcquireRequest) {
	h.Helper()
	rec := res.Record
	h.checkHeld(rec, req, res.Lease)
	if !rec.LeaseUntil.Equal(res.Lease.Until) {
		h.Fatalf("Acquired record LeaseUntil = %v, lease Until = %v", rec.LeaseUntil, res.Lease.Until)
	}
	got, err := h.store.Get(h.ctx, req.Scope, req.Key)
	if err != nil {
		h.Fatalf("Get(%q, %q) after Acquired: %v", req.Scope, req.Key, err)
	}
	if d := DiffRecord(got, rec); d != "" {
		h.Fatalf("Acquired result's record differs from Get's: %s", d)
	}
}

// lease acquires a key that must be free.
func (h *harness) lease(req idem.AcquireRequest) idem.Lease {
	h.Helper()
	return h.expect(req, idem.Acquired).Lease
}

func (h *harness) complete(l idem.Lease, resp idem.Response) {
	h.Helper()
	if err := h.store.Complete(h.ctx, l, resp, longRetention); err != nil {
		h.Fatalf("Complete(%q, fence %d): %v", l.Key, l.Fence, err)
	}
}

func (h *harness) get(key string) idem.Record {
	h.Helper()
	rec, err := h.store.Get(h.ctx, h.scope, key)
	if err != nil {
		h.Fatalf("Get(%q): %v", key, err)
	}
	if rec.Scope != h.scope || rec.Key != key {
		h.Fatalf("Get(%q) returned the record of (%q, %q)", key, rec.Scope, rec.Key)
	}
	return rec
}

func (h *harness) notFound(key string) {
	h.Helper()
	rec, err := h.store.Get(h.ctx, h.scope, key)
	if !errors.Is(err, idem.ErrNotFound) {
		h.Fatalf("Get(%q) = %s, %v; want idem.ErrNotFound", key, fmtRecord(rec), err)
	}
}

// leaseLost fails the case unless err is idem.ErrLeaseLost.
func (h *harness) leaseLost(op string, err error) {
	h.Helper()
	if !errors.Is(err, idem.ErrLeaseLost) {
		h.Fatalf("%s = %v, want idem.ErrLeaseLost", op, err)
	}
}

// unchanged fails the case unless the record of key still is before.
func (h *harness) unchanged(key string, before idem.Record, after string) {
	h.Helper()
	rec := h.get(key)
	if d := DiffRecord(rec, before); d != "" {
		h.Fatalf("record changed after %s: %s", after, d)
	}
}

// near fails the case unless got is within tol of want.
func (h *harness) near(what string, got, want time.Time, tol time.Duration) {
	h.Helper()
	if got.IsZero() {
		h.Fatalf("%s is zero", what)
	}
	if d := got.Sub(want); d > tol || d < -tol {
		h.Fatalf("%s = %v, want %v ± %v (off by %v)", what, got, want, tol, d)
	}
}

func (h *harness) nearDuration(what string, got, want, tol time.Duration) {
	h.Helper()
	if d := got - want; d > tol || d < -tol {
		h.Fatalf("%s = %v, want %v ± %v", what, got, want, tol)
	}
}

// checkLease checks a lease just handed out for req.
func (h *harness) checkLease(l idem.Lease, req idem.AcquireRequest) {
	h.Helper()
	if l.Scope != req.Scope || l.Key != req.Key {
		h.Fatalf("lease is for (%q, %q), want (%q, %q)", l.Scope, l.Key, req.Scope, req.Key)
	}
	if l.Owner == "" {
		h.Fatal("lease has an empty owner")
	}
	if l.Fence < 1 {
		h.Fatalf("lease fence = %d, want >= 1", l.Fence)
	}
	h.near("lease Until", l.Until, time.Now().Add(req.Lease), skew)
}

// checkHeld checks the record of a processing key held by l, acquired
// with req.
func (h *harness) checkHeld(rec idem.Record, req idem.AcquireRequest, l idem.Lease) {
	h.Helper()
	switch {
	case rec.Scope != req.Scope || rec.Key != req.Key:
		h.Fatalf("record is (%q, %q), want (%q, %q)", rec.Scope, rec.Key, req.Scope, req.Key)
	case rec.Status != idem.StatusProcessing:
		h.Fatalf("record status = %q, want %q", rec.Status, idem.StatusProcessing)
	case rec.Fingerprint != req.Fingerprint:
		h.Fatalf("record fingerprint = %q, want %q", rec.Fingerprint, req.Fingerprint)
	case rec.Owner != l.Owner || rec.Fence != l.Fence:
		h.Fatalf("record owner/fence = %q/%d, want the lease's %q/%d", rec.Owner, rec.Fence, l.Owner, l.Fence)
	case rec.Response != nil:
		h.Fatalf("processing record has a response: %+v", rec.Response)
	case !rec.CompletedAt.IsZero():
		h.Fatalf("processing record has CompletedAt %v", rec.CompletedAt)
	}
	h.near("LeaseUntil", rec.LeaseUntil, l.Until, h.tol())
	h.nearDuration("Retention", rec.Retention, req.Retention, h.caps.Precision)
	h.near("ExpiresAt", rec.ExpiresAt, rec.LeaseUntil.Add(rec.Retention), h.tol())
	h.near("CreatedAt", rec.CreatedAt, time.Now(), skew+req.Lease)
	if rec.CreatedAt.After(rec.LeaseUntil) {
		h.Fatalf("CreatedAt %v is after LeaseUntil %v", rec.CreatedAt, rec.LeaseUntil)
	}
}

// checkCompleted checks the record of a key that l completed with resp
// and retention.
func (h *harness) checkCompleted(rec idem.Record, fp idem.Fingerprint, l idem.Lease, resp idem.Response, retention time.Duration) {
	h.Helper()
	switch {
	case rec.Scope != l.Scope || rec.Key != l.Key:
		h.Fatalf("record is (%q, %q), want (%q, %q)", rec.Scope, rec.Key, l.Scope, l.Key)
	case rec.Status != idem.StatusCompleted:
		h.Fatalf("record status = %q, want %q", rec.Status, idem.StatusCompleted)
	case rec.Fingerprint != fp:
		h.Fatalf("record fingerprint = %q, want %q", rec.Fingerprint, fp)
	case rec.Owner != l.Owner || rec.Fence != l.Fence:
		h.Fatalf("completed record owner/fence = %q/%d, want the completing lease's %q/%d", rec.Owner, rec.Fence, l.Owner, l.Fence)
	}
	if d := diffResponse(rec.Response, resp); d != "" {
		h.Fatalf("stored response: %s", d)
	}
	h.near("CompletedAt", rec.CompletedAt, time.Now(), skew)
	h.near("CreatedAt", rec.CreatedAt, time.Now(), skew+longLease)
	if rec.CompletedAt.Before(rec.CreatedAt) {
		h.Fatalf("CompletedAt %v is before CreatedAt %v", rec.CompletedAt, rec.CreatedAt)
	}
	h.nearDuration("Retention", rec.Retention, retention, h.caps.Precision)
	h.near("ExpiresAt", rec.ExpiresAt, rec.CompletedAt.Add(retention), h.tol())
}

// race runs n calls of f at once and returns their results.
func race[T any](n int, f func(i int) T) []T {
	out := make([]T, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// diffResponse describes how got differs from want; "" if it does not.
// Nil and empty bodies and headers are the same.
func diffResponse(got *idem.Response, want idem.Response) string {
	if got == nil {
		return "no response"
	}
	var d []string
	if got.StatusCode != want.StatusCode {
		d = append(d, fmt.Sprintf("status %d, want %d", got.StatusCode, want.StatusCode))
	}
	if got.BodyOmitted != want.BodyOmitted {
		d = append(d, fmt.Sprintf("BodyOmitted %v, want %v", got.BodyOmitted, want.BodyOmitted))
	}
	if !bytes.Equal(got.Body, want.Body) {
		d = append(d, fmt.Sprintf("body of %d bytes differs from the %d bytes stored (first difference at byte %d)", len(got.Body), len(want.Body), firstDiff(got.Body, want.Body)))
	}
	if len(got.Header) != len(want.Header) {
		d = append(d, fmt.Sprintf("header %v, want %v", got.Header, want.Header))
	} else {
		for name, values := range want.Header {
			if g, ok := got.Header[name]; !ok || !slices.Equal(g, values) {
				d = append(d, fmt.Sprintf("header %q = %q, want %q", name, g, values))
			}
		}
	}
	return strings.Join(d, "; ")
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// DiffRecord describes how got differs from want, field by field, or
// returns "" if they are the same record: times are compared with
// time.Time.Equal, responses by content (nil and empty bodies and headers
// are the same). Stores and caches built on them use it in their tests.
func DiffRecord(got, want idem.Record) string {
	var d []string
	add := func(field string, g, w any) { d = append(d, fmt.Sprintf("%s %v, want %v", field, g, w)) }
	if got.Scope != want.Scope || got.Key != want.Key {
		add("identity", got.Scope+"/"+got.Key, want.Scope+"/"+want.Key)
	}
	if got.Fingerprint != want.Fingerprint {
		add("Fingerprint", got.Fingerprint, want.Fingerprint)
	}
	if got.Status != want.Status {
		add("Status", got.Status, want.Status)
	}
	if got.Owner != want.Owner {
		add("Owner", got.Owner, want.Owner)
	}
	if got.Fence != want.Fence {
		add("Fence", got.Fence, want.Fence)
	}
	if got.Retention != want.Retention {
		add("Retention", got.Retention, want.Retention)
	}
	for _, f := range []struct {
		name string
		g, w time.Time
	}{
		{"LeaseUntil", got.LeaseUntil, want.LeaseUntil},
		{"CreatedAt", got.CreatedAt, want.CreatedAt},
		{"CompletedAt", got.CompletedAt, want.CompletedAt},
		{"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
	} {
		if !f.g.Equal(f.w) {
			add(f.name, f.g, f.w)
		}
	}
	switch {
	case (got.Response == nil) != (want.Response == nil):
		add("Response", got.Response != nil, want.Response != nil)
	case got.Response != nil:
		if r := diffResponse(got.Response, *want.Response); r != "" {
			d = append(d, "Response: "+r)
		}
	}
	return strings.Join(d, "; ")
}

func fmtRecord(rec idem.Record) string {
	s := fmt.Sprintf("record{%q/%q %s fp=%q owner=%q fence=%d lease_until=%v expires_at=%v",
		rec.Scope, rec.Key, rec.Status, rec.Fingerprint, rec.Owner, rec.Fence, rec.LeaseUntil, rec.ExpiresAt)
	if rec.Response != nil {
		s += fmt.Sprintf(" response{status=%d body=%dB omitted=%v}", rec.Response.StatusCode, len(rec.Response.Body), rec.Response.BodyOmitted)
	}
	return s + "}"
}

func fmtResult(res idem.AcquireResult) string {
	if res.Outcome == idem.Acquired {
		return fmt.Sprintf("lease{owner=%q fence=%d until=%v took_over=%v}", res.Lease.Owner, res.Lease.Fence, res.Lease.Until, res.TookOver)
	}
	return fmtRecord(res.Record)
}
