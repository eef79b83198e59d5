package admin_test

import (
	"context"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/internal/admin"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/memstore"
)

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z0-9]+)" value="([^"]*)">`)

// confirmForm returns the form a confirmation page posts: its hidden
// fields (confirm=yes included).
func confirmForm(t *testing.T, a answer) url.Values {
	t.Helper()
	if a.code != http.StatusOK || !strings.Contains(a.body, `id="confirm"`) {
		t.Fatalf("confirmation page: %d\n%s", a.code, a.body)
	}
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(a.body, -1) {
		form.Set(m[1], html.UnescapeString(m[2]))
	}
	if form.Get("confirm") != "yes" {
		t.Fatalf("the confirmation page posts no confirm=yes:\n%s", a.body)
	}
	return form
}

// TestEvictRecordReplacedSinceConfirmed: the operator confirms the
// eviction of a record; before the confirmation arrives, the record is
// evicted and a new request with the same key creates a new one (same
// fence, another owner) and completes. The confirmation deletes nothing
// (409, saying why) and the new record stays; a new confirmation, of the
// new record, evicts it.
func TestEvictRecordReplacedSinceConfirmed(t *testing.T) {
	f := setup(t, nil)
	ctx := t.Context()
	cookie, csrf := f.login(t)
	start := url.Values{"csrf": {csrf}, "scope64": {"YWNjdC03"}, "key64": {"c2VjcmV0LWtleS0x"}}
	form := confirmForm(t, f.send(t, "POST", "/admin/evict", "cookie:"+cookie, start))
	if form.Get("fence") != "1" || form.Get("owner") == "" {
		t.Fatalf("the confirmation names no record: fence %q, owner %q", form.Get("fence"), form.Get("owner"))
	}
	old, err := f.store.Get(ctx, "acct-7", "secret-key-1")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(form.Get("owner"), old.Owner) {
		t.Fatal("the confirmation page hands out the owner token")
	}

	// Meanwhile: evicted by someone else, and run again by a new request.
	if err := f.store.Delete(ctx, "acct-7", "secret-key-1"); err != nil {
		t.Fatal(err)
	}
	acq, err := f.store.Acquire(ctx, idem.AcquireRequest{Scope: "acct-7", Key: "secret-key-1", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || acq.Outcome != idem.Acquired || acq.Lease.Fence != old.Fence {
		t.Fatalf("the new request: %+v %v; want acquired at fence %d", acq, err, old.Fence)
	}
	if err := f.store.Complete(ctx, acq.Lease, idem.Response{StatusCode: 202}, time.Hour); err != nil {
		t.Fatal(err)
	}

	a := f.send(t, "POST", "/admin/evict", "cookie:"+cookie, form)
	if a.code != http.StatusConflict || !strings.Contains(a.body, "changed since you confirmed") || !strings.Contains(a.body, "nothing was deleted") {
		t.Fatalf("confirmation of a record replaced since: %d %q; want 409 saying it changed", a.code, a.body)
	}
	rec, err := f.store.Get(ctx, "acct-7", "secret-key-1")
	if err != nil || rec.Owner != acq.Lease.Owner || rec.Response == nil || rec.Response.StatusCode != 202 {
		t.Fatalf("after the refused eviction: %+v, %v; want the new request's record", rec, err)
	}
	logs := f.log.String()
	if !strings.Contains(logs, "changed since it was confirmed") || strings.Contains(logs, "record evicted") || strings.Contains(logs, "secret-key-1") {
		t.Fatalf("the refusal's log:\n%s", logs)
	}

	// Reloaded: the new record is confirmed and evicted.
	form = confirmForm(t, f.send(t, "POST", "/admin/evict", "cookie:"+cookie, start))
	if a := f.send(t, "POST", "/admin/evict", "cookie:"+cookie, form); a.code != http.StatusSeeOther || f.recordExists(t) {
		t.Fatalf("eviction of the record confirmed: %d %q, record kept %v", a.code, a.body, f.recordExists(t))
	}
}

// gapStore is a memstore whose Get runs afterGet (once, when set) after
// reading: what another execution does between the page's read and its
// deletion.
type gapStore struct {
	*memstore.Store
	mu       sync.Mutex
	afterGet func()
}

func (s *gapStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	rec, err := s.Store.Get(ctx, scope, key)
	s.mu.Lock()
	f := s.afterGet
	s.afterGet = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	return rec, err
}

// TestEvictTakenOverAfterRead: the record confirmed is an abandoned one
// (its lease ended); a retry takes it over right after the confirmed post
// read it, before the deletion. The eviction deletes nothing (409) and
// the retry's live record stays: no third execution can run beside it.
func TestEvictTakenOverAfterRead(t *testing.T) {
	var now atomic.Pointer[time.Time]
	t0 := time.Now()
	now.Store(&t0)
	clock := func() time.Time { return *now.Load() }
	st := &gapStore{Store: memstore.New(&memstore.Config{Now: clock})}
	logs := &obstest.LogBuffer{}
	h, err := admin.New(&admin.Config{Token: token, Name: "testd", Logger: slog.New(slog.NewTextHandler(logs, nil)), Store: st, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{h: h, log: logs}
	ctx := t.Context()
	req := idem.AcquireRequest{Scope: "acct-9", Key: "stuck-key", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}
	first, err := st.Acquire(ctx, req)
	if err != nil || first.Outcome != idem.Acquired {
		t.Fatal(first, err)
	}
	later := t0.Add(2 * time.Minute) // its holder died: the lease ended
	now.Store(&later)

	start := url.Values{"scope": {"acct-9"}, "key": {"stuck-key"}}
	form := confirmForm(t, f.send(t, "POST", "/admin/evict", "bearer:"+token, start))
	var retry idem.AcquireResult
	st.mu.Lock()
	st.afterGet = func() {
		var rerr error
		retry, rerr = st.Acquire(ctx, req)
		if rerr != nil || retry.Outcome != idem.Acquired || !retry.TookOver {
			t.Errorf("the retry: %+v %v; want it to take the record over", retry, rerr)
		}
	}
	st.mu.Unlock()
	a := f.send(t, "POST", "/admin/evict", "bearer:"+token, form)
	if a.code != http.StatusConflict || !strings.Contains(a.body, "changed since you confirmed") {
		t.Fatalf("eviction of a record taken over after the read: %d %q; want 409", a.code, a.body)
	}
	rec, err := st.Get(ctx, "acct-9", "stuck-key")
	if err != nil || rec.Owner != retry.Lease.Owner || rec.Fence != first.Lease.Fence+1 {
		t.Fatalf("after the refused eviction: %+v, %v; want the retry's record (fence %d)", rec, err, first.Lease.Fence+1)
	}
	if again, err := st.Acquire(ctx, req); err != nil || again.Outcome != idem.InFlight {
		t.Fatalf("another retry: %+v %v; want it in flight (the retry runs)", again, err)
	}
	if logs := logs.String(); !strings.Contains(logs, "changed since it was confirmed") || strings.Contains(logs, "record evicted") {
		t.Fatalf("the refusal's log:\n%s", logs)
	}
}
