package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/admin"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/memstore"
)

// TestEvictConfirmsOnlyARecordShown: "Evict by key" of a key that has no
// record yet must not hand out a confirmation: one confirmed later would
// name no record, and would delete whatever record the key has by then,
// which the operator never saw. The page answers 404 and offers nothing
// to confirm; once the key has a record, the confirmation names it.
func TestEvictConfirmsOnlyARecordShown(t *testing.T) {
	f := setup(t, nil)
	ctx := t.Context()
	cookie, csrf := f.login(t)
	start := url.Values{"csrf": {csrf}, "scope": {"acct-7"}, "key": {"later-key"}}
	a := f.send(t, "POST", "/admin/evict", "cookie:"+cookie, start)
	if a.code != http.StatusNotFound || strings.Contains(a.body, `name="confirm"`) || !strings.Contains(a.body, idem.HashKey("acct-7", "later-key")) {
		t.Fatalf("eviction of a key without a record: %d\n%s\nwant 404 naming its hash, and no confirmation", a.code, a.body)
	}

	// Once the key has a record, its confirmation names it.
	acq, err := f.store.Acquire(ctx, idem.AcquireRequest{Scope: "acct-7", Key: "later-key", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || acq.Outcome != idem.Acquired {
		t.Fatal(acq, err)
	}
	if err := f.store.Complete(ctx, acq.Lease, idem.Response{StatusCode: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	shown := confirmForm(t, f.send(t, "POST", "/admin/evict", "cookie:"+cookie, start))
	if shown.Get("fence") == "" || shown.Get("owner") == "" {
		t.Fatalf("the confirmation of a record names none: %v", shown)
	}
	if rec, err := f.store.Get(ctx, "acct-7", "later-key"); err != nil || rec.Owner != acq.Lease.Owner {
		t.Fatalf("the new record after the confirmation page: %+v %v", rec, err)
	}
}

// failingGetStore is a store without DeleteIf whose Get fails while fail
// is set.
type failingGetStore struct {
	idem.Store
	fail atomic.Bool
}

func (s *failingGetStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if s.fail.Load() {
		return idem.Record{}, errors.New("store down")
	}
	return s.Store.Get(ctx, scope, key)
}

// TestEvictUnreadRecordIsKept: a confirmation whose record cannot be read
// again (the store's Get fails) deletes nothing, also over a store
// without DeleteIf, where the confirmed record would otherwise not be
// compared with the one deleted; and a confirmation page cannot be had
// without reading the record.
func TestEvictUnreadRecordIsKept(t *testing.T) {
	ctx := t.Context()
	mem := memstore.New(nil)
	st := &failingGetStore{Store: mem}
	logs := &obstest.LogBuffer{}
	h, err := admin.New(&admin.Config{Token: token, Name: "testd", Logger: slog.New(slog.NewTextHandler(logs, nil)), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{h: h, log: logs}
	req := idem.AcquireRequest{Scope: "acct-1", Key: "k-1", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	acq, err := mem.Acquire(ctx, req)
	if err != nil || acq.Outcome != idem.Acquired {
		t.Fatal(acq, err)
	}
	if err := mem.Complete(ctx, acq.Lease, idem.Response{StatusCode: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	start := url.Values{"scope": {"acct-1"}, "key": {"k-1"}}
	form := confirmForm(t, f.send(t, "POST", "/admin/evict", "bearer:"+token, start))

	st.fail.Store(true)
	if a := f.send(t, "POST", "/admin/evict", "bearer:"+token, start); a.code != http.StatusBadGateway || strings.Contains(a.body, `name="confirm"`) {
		t.Fatalf("confirmation page while the record cannot be read: %d\n%s\nwant 502 and no confirmation", a.code, a.body)
	}
	a := f.send(t, "POST", "/admin/evict", "bearer:"+token, form)
	st.fail.Store(false)
	if a.code != http.StatusBadGateway {
		t.Fatalf("confirmed eviction while the record cannot be read: %d %q, want 502", a.code, a.body)
	}
	if rec, err := mem.Get(ctx, "acct-1", "k-1"); err != nil || rec.Owner != acq.Lease.Owner {
		t.Fatalf("the record after an eviction that could not read it: %+v %v; want it kept", rec, err)
	}
	if l := logs.String(); strings.Contains(l, "record evicted") || !strings.Contains(l, "evict failed") {
		t.Fatalf("the log:\n%s", l)
	}
}
