// Package outboxtest is the conformance suite of outbox.Store: every store
// runs it against a real server. Each case gets a fresh harness (an empty
// outbox), adds messages through the harness, and checks what Claim,
// MarkSent, Release and Sweep answer and what a later Claim sees; the
// relay cases run several outbox.Relay at once and check what a recording
// publisher received.
package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
)

// Harness is one empty outbox and the means to fill it.
type Harness struct {
	// Store is the store under test; nothing else claims from it.
	Store outbox.Store
	// Add adds msgs in one transaction, commits it, and returns their
	// IDs. Required.
	Add func(ctx context.Context, msgs ...outbox.Message) ([]string, error)
	// AddRollback adds msgs in one transaction and rolls it back. Nil
	// skips the case.
	AddRollback func(ctx context.Context, msgs ...outbox.Message) error
	// Reopen returns a harness over the same outbox through a new store
	// whose messages' IDs start with prefix: a restart with another
	// configuration, a rolling deploy. Nil skips the case.
	Reopen func(t *testing.T, prefix string) Harness
}

// Caps says how a store claims.
type Caps struct {
	// ExclusiveClaims says that one live batch at a time holds messages
	// (a lease over the whole outbox, SQLite's): a Claim while another
	// batch is live returns an empty batch. Otherwise a concurrent Claim
	// returns the heads that the live batch does not hold.
	ExclusiveClaims bool
}

// Run runs the suite. newHarness is called once per case, twice for the
// cases on two outboxes: each call returns a new outbox (a database of
// its own, as a shop re-created or a second shop would have) configured
// as the others (the same ID prefix).
func Run(t *testing.T, newHarness func(t *testing.T) Harness, caps Caps) {
	t.Helper()
	harness := func(t *testing.T) Harness {
		t.Helper()
		h := newHarness(t)
		if h.Store == nil || h.Add == nil {
			t.Fatal("outboxtest: Harness without Store or Add")
		}
		return h
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, harness(t), caps) })
	}
	for _, c := range pairCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, harness(t), harness(t), caps) })
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, h Harness, caps Caps)
}{
	{"RoundTrip", roundTrip},
	{"HeadsPerKey", headsPerKey},
	{"ReleaseRepublishesSameID", releaseRepublishes},
	{"PartialMark", partialMark},
	{"BatchEndsOnce", batchEndsOnce},
	{"MarkAfterClaimContextEnds", markAfterCancel},
	{"Invalid", invalid},
	{"HostileBytes", hostileBytes},
	{"RolledBack", rolledBack},
	{"Sweep", sweep},
	{"RelaysOrderPerKey", relaysOrderPerKey},
	{"NotifierWakesRelay", notifierWakes},
	{"Backlog", backlog},
	{"IDsKeptAcrossPrefixChange", idsKeptAcrossPrefixChange},
}

// pairCases run on two outboxes.
var pairCases = []struct {
	name string
	run  func(t *testing.T, a, b Harness, caps Caps)
}{
	{"IDsUniqueAcrossOutboxes", idsUniqueAcrossOutboxes},
}

// idsUniqueAcrossOutboxes: two outboxes configured alike (two databases,
// or one dropped and re-created) give their messages IDs that none of
// the other's has, as Add returned them and as Claim does. A broker
// de-duplicates by the ID across every producer of a stream, and a
// consumer's inbox across every producer it reads: an ID of one outbox
// that the other gave too would drop the second message.
func idsUniqueAcrossOutboxes(t *testing.T, a, b Harness, _ Caps) {
	seen := map[string]string{}
	for _, o := range []struct {
		name string
		h    Harness
	}{{"first", a}, {"second", b}} {
		added := add(t, o.h, msg("t", "k", "1"), msg("t", "", "2"), msg("t", "j", "3"))
		added = append(added, add(t, o.h, msg("t", "i", "4"))...)
		if got := claimIDs(t, o.h.Store, 10, true); !slices.Equal(got, added) {
			t.Fatalf("%s outbox: Claim = %q, want the IDs Add returned %q", o.name, got, added)
		}
		for _, id := range added {
			if other, dup := seen[id]; dup {
				t.Fatalf("ID %q given by the %s outbox and by the %s", id, o.name, other)
			}
			seen[id] = o.name
		}
	}
}

// idsKeptAcrossPrefixChange: a message's ID is fixed when it is added. A
// store re-created with another ID prefix claims the pending messages
// with the IDs Add returned, also one already claimed and released (a
// publish whose mark was lost), and gives the new prefix to new
// messages only: a message published twice, once by each configuration,
// carries one ID, which the broker and the inboxes de-duplicate.
func idsKeptAcrossPrefixChange(t *testing.T, h Harness, _ Caps) {
	if h.Reopen == nil {
		t.Skip("outboxtest: no Harness.Reopen")
	}
	old := add(t, h, msg("t", "k", "1"), msg("t", "j", "1"), msg("t", "k", "2"))
	if got := claimIDs(t, h.Store, 10, false); !slices.Equal(got, []string{old[0], old[1]}) { // published, mark lost
		t.Fatalf("Claim = %q, want %q", got, old[:2])
	}
	const prefix = "after-change/"
	r := h.Reopen(t, prefix)
	added := add(t, r, msg("t", "k", "3"), msg("t", "i", "1"))
	for _, id := range added {
		if !strings.HasPrefix(id, prefix) || slices.Contains(old, id) {
			t.Fatalf("Add after the change = %q, want a new ID starting with %q", id, prefix)
		}
	}
	if got, want := claimIDs(t, r.Store, 10, true), []string{old[0], old[1], added[1]}; !slices.Equal(got, want) {
		t.Fatalf("Claim after the change = %q, want %q (the IDs Add returned)", got, want)
	}
	if got, want := claimIDs(t, r.Store, 10, true), []string{old[2]}; !slices.Equal(got, want) {
		t.Fatalf("then Claim = %q, want %q", got, want)
	}
	if got, want := claimIDs(t, h.Store, 10, true), []string{added[0]}; !slices.Equal(got, want) {
		t.Fatalf("then Claim on the first store = %q, want %q", got, want)
	}
}

func add(t *testing.T, h Harness, msgs ...outbox.Message) []string {
	t.Helper()
	ids, err := h.Add(t.Context(), msgs...)
	if err != nil {
		t.Fatalf("Add: %v", err)
	}
	if len(ids) != len(msgs) {
		t.Fatalf("Add returned %d IDs for %d messages", len(ids), len(msgs))
	}
	return ids
}

func claim(t *testing.T, s outbox.Store, limit int) outbox.Batch {
	t.Helper()
	b, err := s.Claim(t.Context(), limit)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return b
}

func ids(b outbox.Batch) []string {
	var out []string
	for _, m := range b.Messages() {
		out = append(out, m.ID)
	}
	return out
}

// claimIDs claims, returns the IDs, and marks them all sent if mark.
func claimIDs(t *testing.T, s outbox.Store, limit int, mark bool) []string {
	t.Helper()
	b := claim(t, s, limit)
	got := ids(b)
	var err error
	if mark {
		err = b.MarkSent(t.Context(), got)
	} else {
		err = b.Release(t.Context())
	}
	if err != nil {
		t.Fatalf("end batch: %v", err)
	}
	return got
}

func msg(topic, key string, payload string) outbox.Message {
	return outbox.Message{Topic: topic, Key: key, Payload: []byte(payload)}
}

func roundTrip(t *testing.T, h Harness, _ Caps) {
	before := time.Now().Add(-time.Minute)
	in := []outbox.Message{
		{Topic: "order.paid", Key: "order-1", Payload: []byte(`{"amount_cents":1299}`), Headers: map[string]string{"content-type": "application/json", "trace": "x"}},
		{Topic: "order.closed", Key: "order-2", Payload: []byte{0, 1, 2, 255}},
		{Topic: "ping", Payload: nil},
	}
	got := add(t, h, in...)
	if len(slices.Compact(slices.Clone(got))) != 3 || slices.Contains(got, "") {
		t.Fatalf("IDs %q are not three distinct non-empty IDs", got)
	}
	b := claim(t, h.Store, 10)
	ms := b.Messages()
	if len(ms) != 3 {
		t.Fatalf("Claim returned %d messages, want 3", len(ms))
	}
	for i, m := range ms {
		w := in[i]
		if m.ID != got[i] || m.Topic != w.Topic || m.Key != w.Key || !bytes.Equal(m.Payload, w.Payload) {
			t.Errorf("message %d = %+v, want %+v with ID %s", i, m, w, got[i])
		}
		if len(m.Headers)+len(w.Headers) > 0 && !maps.Equal(m.Headers, w.Headers) {
			t.Errorf("message %d headers = %v, want %v", i, m.Headers, w.Headers)
		}
		if m.CreatedAt.Before(before) || m.CreatedAt.After(time.Now().Add(time.Minute)) {
			t.Errorf("message %d CreatedAt %v is not about now", i, m.CreatedAt)
		}
	}
	if err := b.MarkSent(t.Context(), got); err != nil {
		t.Fatalf("MarkSent: %v", err)
	}
	if left := claimIDs(t, h.Store, 10, false); len(left) != 0 {
		t.Fatalf("after MarkSent, Claim returned %q", left)
	}
}

func headsPerKey(t *testing.T, h Harness, caps Caps) {
	ids := add(t, h,
		msg("t", "a", "a1"), msg("t", "a", "a2"), msg("t", "b", "b1"),
		msg("t", "", "u1"), msg("t", "a", "a3"), msg("t", "", "u2"), msg("t", "b", "b2"))
	a1, a2, b1, u1, a3, u2, b2 := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6]

	// Heads only: a1, b1, and every unkeyed message.
	b := claim(t, h.Store, 10)
	if got, want := ids2(b), []string{a1, b1, u1, u2}; !slices.Equal(got, want) {
		t.Fatalf("first Claim = %q, want %q (the head of each key, the unkeyed)", got, want)
	}
	// While b lives, nothing of a or b is claimable elsewhere.
	b2nd := claim(t, h.Store, 10)
	if got := ids2(b2nd); len(got) != 0 {
		t.Fatalf("Claim during a live batch = %q, want none (heads held, a2/a3/b2 behind them)", got)
	}
	if err := b2nd.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.MarkSent(t.Context(), []string{a1, b1, u1, u2}); err != nil {
		t.Fatal(err)
	}
	// Limit counts messages.
	if got, want := claimIDs(t, h.Store, 1, true), []string{a2}; !slices.Equal(got, want) {
		t.Fatalf("Claim(1) = %q, want %q", got, want)
	}
	if got, want := claimIDs(t, h.Store, 10, true), []string{a3, b2}; !slices.Equal(got, want) {
		t.Fatalf("Claim = %q, want %q", got, want)
	}
	_ = caps
}

func ids2(b outbox.Batch) []string { return ids(b) }

func releaseRepublishes(t *testing.T, h Harness, _ Caps) {
	want := add(t, h, msg("t", "k", "1"), msg("t", "k", "2"), msg("t", "j", "1"))
	first := claimIDs(t, h.Store, 10, false) // published, never marked
	if !slices.Equal(first, []string{want[0], want[2]}) {
		t.Fatalf("Claim = %q, want %q", first, []string{want[0], want[2]})
	}
	again := claimIDs(t, h.Store, 10, true)
	if !slices.Equal(again, first) {
		t.Fatalf("after Release, Claim = %q, want the same IDs %q", again, first)
	}
	if got := claimIDs(t, h.Store, 10, true); !slices.Equal(got, []string{want[1]}) {
		t.Fatalf("then Claim = %q, want %q", got, want[1:2])
	}
}

func partialMark(t *testing.T, h Harness, _ Caps) {
	id := add(t, h, msg("t", "k", "1"), msg("t", "j", "1"), msg("t", "k", "2"))
	b := claim(t, h.Store, 10)
	if got := ids(b); !slices.Equal(got, []string{id[0], id[1]}) {
		t.Fatalf("Claim = %q", got)
	}
	if err := b.MarkSent(t.Context(), []string{id[0]}); err != nil {
		t.Fatal(err)
	}
	if got, want := claimIDs(t, h.Store, 10, true), []string{id[1], id[2]}; !slices.Equal(got, want) {
		t.Fatalf("after marking %s only, Claim = %q, want %q", id[0], got, want)
	}
}

func batchEndsOnce(t *testing.T, h Harness, _ Caps) {
	id := add(t, h, msg("t", "k", "1"))
	b := claim(t, h.Store, 10)
	if err := b.MarkSent(t.Context(), []string{"not-" + id[0]}); err == nil {
		t.Fatal("MarkSent of an ID not in the batch succeeded")
	}
	if err := b.Release(t.Context()); err != nil {
		t.Fatalf("Release after a refused MarkSent: %v", err)
	}
	if err := b.MarkSent(t.Context(), id); !errors.Is(err, outbox.ErrBatchDone) {
		t.Fatalf("MarkSent after Release = %v, want ErrBatchDone", err)
	}
	if err := b.Release(t.Context()); !errors.Is(err, outbox.ErrBatchDone) {
		t.Fatalf("Release twice = %v, want ErrBatchDone", err)
	}
	if got := claimIDs(t, h.Store, 10, true); !slices.Equal(got, id) {
		t.Fatalf("Claim = %q, want %q still pending", got, id)
	}
}

// markAfterCancel: a relay stopping (its context cancelled) after the
// publisher confirmed still marks what was confirmed.
func markAfterCancel(t *testing.T, h Harness, _ Caps) {
	id := add(t, h, msg("t", "k", "1"))
	ctx, cancel := context.WithCancel(t.Context())
	b, err := h.Store.Claim(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	time.Sleep(10 * time.Millisecond) // let a watcher of ctx act on it
	if err := b.MarkSent(context.WithoutCancel(ctx), ids(b)); err != nil {
		t.Fatalf("MarkSent after the claim's context ended: %v", err)
	}
	if got := claimIDs(t, h.Store, 10, false); len(got) != 0 {
		t.Fatalf("Claim = %q, want none pending (%s marked)", got, id[0])
	}
}

func invalid(t *testing.T, h Harness, _ Caps) {
	long := string(bytes.Repeat([]byte("x"), outbox.MaxTopicLen+1))
	for _, m := range []outbox.Message{
		{}, {Topic: long}, {Topic: "t", Key: long}, {Topic: "\xff"}, {Topic: "t", Headers: map[string]string{"": "v"}},
		// Headers a broker or a publisher interprets.
		{Topic: "t", Headers: map[string]string{"Nats-Msg-Id": "other"}},
		{Topic: "t", Headers: map[string]string{"nats-rollup": "sub"}},
		{Topic: "t", Headers: map[string]string{"CC": "other.queue"}},
	} {
		if _, err := h.Add(t.Context(), msg("t", "ok", "before"), m); !errors.Is(err, outbox.ErrInvalid) {
			t.Errorf("Add(%+v) = %v, want ErrInvalid", m, err)
		}
	}
	if got := claimIDs(t, h.Store, 10, false); len(got) != 0 {
		t.Fatalf("after refused Adds, Claim = %q, want none", got)
	}
}

// hostileBytes: a message with bytes a store cannot keep as they are (a
// NUL in the topic or the key, a header value that is not UTF-8) or a
// broker cannot carry (a header name other than printable ASCII, with a
// character NATS refuses, or longer than AMQP's 255 bytes) is refused
// with ErrInvalid; one the stores can keep (other control characters, a
// NUL in a header value, SQL metacharacters) round-trips byte for byte. Never a message that is stored or published other than
// it was added.
func hostileBytes(t *testing.T, h Harness, _ Caps) {
	for _, m := range []outbox.Message{
		{Topic: "t\x00x"},
		{Topic: "t", Key: "k\x00"},
		{Topic: "t", Headers: map[string]string{"trace": "\xff\xfe"}},
		{Topic: "t", Headers: map[string]string{"\xff": "v"}},
		// Header names NATS refuses, or too long for AMQP: every publish
		// would fail.
		{Topic: "t", Headers: map[string]string{"h\x01": "v"}},
		{Topic: "t", Headers: map[string]string{"\u00e9": "v"}},
		{Topic: "t", Headers: map[string]string{"Content Type": "v"}},
		{Topic: "t", Headers: map[string]string{"a:b": "v"}},
		{Topic: "t", Headers: map[string]string{strings.Repeat("h", outbox.MaxHeaderNameLen+1): "v"}},
		// Values and keys NATS would carry otherwise: a line break becomes
		// a space, spaces and tabs at the ends are trimmed.
		{Topic: "t", Headers: map[string]string{"h": "a\r\nNats-Msg-Id: x"}},
		{Topic: "t", Headers: map[string]string{"h": " v"}},
		{Topic: "t", Key: "k\t"},
	} {
		if _, err := h.Add(t.Context(), m); !errors.Is(err, outbox.ErrInvalid) {
			t.Errorf("Add(%q, key %q, headers %q) = %v, want ErrInvalid", m.Topic, m.Key, m.Headers, err)
		}
	}
	in := outbox.Message{
		Topic:   "t'; DROP TABLE idem_outbox; --\t",
		Key:     "k\"\\%_\x01\u00e9",
		Payload: []byte{0, '\'', 0xff},
		Headers: map[string]string{"h'%_-!*&#$|~^`": "v\x00\t\"\\", "e": "\u2028"},
	}
	id := add(t, h, in)
	b := claim(t, h.Store, 10)
	defer b.Release(t.Context()) //nolint:errcheck // ErrBatchDone after MarkSent
	var m outbox.Message
	for _, c := range b.Messages() {
		if c.ID == id[0] {
			m = c
		}
	}
	if m.ID != id[0] || m.Topic != in.Topic || m.Key != in.Key || !bytes.Equal(m.Payload, in.Payload) || !maps.Equal(m.Headers, in.Headers) {
		t.Errorf("claimed %+q, want %+q", m, in)
	}
}

func rolledBack(t *testing.T, h Harness, _ Caps) {
	if h.AddRollback == nil {
		t.Skip("the harness has no AddRollback")
	}
	if err := h.AddRollback(t.Context(), msg("t", "k", "1"), msg("t", "", "2")); err != nil {
		t.Fatalf("AddRollback: %v", err)
	}
	kept := add(t, h, msg("t", "k", "3"))
	if got := claimIDs(t, h.Store, 10, true); !slices.Equal(got, kept) {
		t.Fatalf("Claim = %q, want only the committed %q", got, kept)
	}
}

func sweep(t *testing.T, h Harness, _ Caps) {
	sent := add(t, h, msg("t", "a", "1"), msg("t", "b", "1"), msg("t", "c", "1"))
	pending := add(t, h, msg("t", "a", "2"))
	if got := claimIDs(t, h.Store, 10, true); !slices.Equal(got, sent) {
		t.Fatalf("Claim = %q, want %q", got, sent)
	}
	if n, err := h.Store.Sweep(t.Context(), time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("Sweep(1h) = %d, %v; want 0 (sent just now)", n, err)
	}
	time.Sleep(60 * time.Millisecond)
	if n, err := h.Store.Sweep(t.Context(), 20*time.Millisecond, 2); err != nil || n != 2 {
		t.Fatalf("Sweep(20ms, limit 2) = %d, %v; want 2", n, err)
	}
	if n, err := h.Store.Sweep(t.Context(), 20*time.Millisecond, 100); err != nil || n != 1 {
		t.Fatalf("second Sweep = %d, %v; want 1", n, err)
	}
	if n, err := h.Store.Sweep(t.Context(), 0, 100); err != nil || n != 0 {
		t.Fatalf("third Sweep = %d, %v; want 0 (the pending message stays)", n, err)
	}
	if got := claimIDs(t, h.Store, 10, true); !slices.Equal(got, pending) {
		t.Fatalf("after sweeping, Claim = %q, want the pending %q", got, pending)
	}
}

// Recorder is a Publisher that records what it received, for tests.
type Recorder struct {
	mu   sync.Mutex
	msgs []outbox.Message
	// Fail, if set, is called before recording; an error refuses the
	// message.
	Fail func(outbox.Message) error
}

// Publish records msg.
func (r *Recorder) Publish(ctx context.Context, msg outbox.Message) error {
	if r.Fail != nil {
		if err := r.Fail(msg); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	r.mu.Unlock()
	return nil
}

// Messages returns what was published, in the order of Publish.
func (r *Recorder) Messages() []outbox.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// WaitFor waits until n messages were recorded or d passed, and returns
// them.
func (r *Recorder) WaitFor(t testing.TB, n int, d time.Duration) []outbox.Message {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := r.Messages()
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// CheckOrder checks that msgs holds each of want (by ID) and no other,
// exactly once when once is set, and that each key's messages appeared,
// first time each, in the order of want.
func CheckOrder(t testing.TB, msgs []outbox.Message, want []outbox.Message, once bool) {
	t.Helper()
	pos := map[string]int{}
	for i, m := range want {
		pos[m.ID] = i
	}
	seen := map[string]int{}
	last := map[string]int{} // key → position in want of the last new message
	for _, m := range msgs {
		p, ok := pos[m.ID]
		if !ok {
			t.Errorf("published unknown message %s", m.ID)
			continue
		}
		if w := want[p]; m.Topic != w.Topic || m.Key != w.Key || !bytes.Equal(m.Payload, w.Payload) {
			t.Errorf("message %s published as %+v, added as %+v", m.ID, m, w)
		}
		seen[m.ID]++
		if seen[m.ID] > 1 {
			if once {
				t.Errorf("message %s published %d times", m.ID, seen[m.ID])
			}
			continue
		}
		if m.Key == "" {
			continue
		}
		if l, ok := last[m.Key]; ok && l > p {
			t.Errorf("key %s: %s published after %s, added before it", m.Key, m.ID, want[l].ID)
		}
		last[m.Key] = p
	}
	for _, m := range want {
		if seen[m.ID] == 0 {
			t.Errorf("message %s (key %q) never published", m.ID, m.Key)
		}
	}
}

// Relays is the number of relays relaysOrderPerKey runs at once.
const Relays = 4

func relaysOrderPerKey(t *testing.T, h Harness, _ Caps) {
	const keys, perKey, unkeyed = 6, 30, 20
	var want []outbox.Message
	var batch []outbox.Message
	for i := range perKey {
		for k := range keys {
			batch = append(batch, msg("t", fmt.Sprintf("key-%d", k), fmt.Sprintf("%d", i)))
		}
	}
	for i := range unkeyed {
		batch = append(batch, msg("t", "", fmt.Sprintf("u%d", i)))
	}
	// Added in chunks, while the relays run.
	rec := &Recorder{}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range Relays {
		r, err := outbox.NewRelay(h.Store, rec, &outbox.RelayConfig{BatchSize: 7, PollInterval: 10 * time.Millisecond, RetryDelay: 10 * time.Millisecond, Retention: -1})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	for chunk := range slices.Chunk(batch, 10) {
		ids := add(t, h, chunk...)
		for i, m := range chunk {
			m.ID = ids[i]
			want = append(want, m)
		}
	}
	got := rec.WaitFor(t, len(want), 60*time.Second)
	cancel()
	wg.Wait()
	CheckOrder(t, rec.Messages(), want, true)
	if len(got) < len(want) {
		t.Fatalf("%d of %d messages published", len(got), len(want))
	}
	if left := claimIDs(t, h.Store, 10, false); len(left) != 0 {
		t.Fatalf("after the relays, Claim = %q, want none pending", left)
	}
}

// notifying wraps a Store that is a Notifier, recording when the relay is
// idle after listening.
type notifying struct {
	outbox.Store
	n         outbox.Notifier
	listening atomic.Bool
	idle      atomic.Bool
}

func (s *notifying) Claim(ctx context.Context, limit int) (outbox.Batch, error) {
	listening := s.listening.Load()
	b, err := s.Store.Claim(ctx, limit)
	if err == nil && len(b.Messages()) == 0 && listening {
		s.idle.Store(true)
	}
	return b, err
}

func (s *notifying) Listen(ctx context.Context, wake func()) error {
	return s.n.Listen(ctx, func() { s.listening.Store(true); wake() })
}

func notifierWakes(t *testing.T, h Harness, _ Caps) {
	n, ok := h.Store.(outbox.Notifier)
	if !ok {
		t.Skip("the store is not an outbox.Notifier")
	}
	probe, cancelProbe := context.WithCancel(t.Context())
	cancelProbe()
	if err := n.Listen(probe, func() {}); errors.Is(err, outbox.ErrNoNotify) {
		t.Skip("the store cannot notify on this database")
	}
	s := &notifying{Store: h.Store, n: n}
	rec := &Recorder{}
	// Polling once an hour: only a notification wakes the relay.
	r, err := outbox.NewRelay(s, rec, &outbox.RelayConfig{PollInterval: time.Hour, RetryDelay: time.Hour, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for !s.idle.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the relay never listened and found the outbox empty")
		}
		time.Sleep(time.Millisecond)
	}
	id := add(t, h, msg("t", "k", "woken"))
	got := rec.WaitFor(t, 1, 30*time.Second)
	if len(got) != 1 || got[0].ID != id[0] {
		t.Fatalf("published %+v, want %s without waiting for the hour's poll", got, id[0])
	}
}

// backlog: a BacklogStore counts the pending messages, claimed or not,
// and dates the oldest; what is marked sent leaves the count.
func backlog(t *testing.T, h Harness, _ Caps) {
	bs, ok := h.Store.(outbox.BacklogStore)
	if !ok {
		t.Skip("the store is not an outbox.BacklogStore")
	}
	measure := func() outbox.Backlog {
		t.Helper()
		b, err := bs.Backlog(t.Context())
		if err != nil {
			t.Fatalf("Backlog: %v", err)
		}
		return b
	}
	if b := measure(); b != (outbox.Backlog{}) {
		t.Fatalf("empty outbox: Backlog %+v, want zero", b)
	}
	add(t, h, outbox.Message{Topic: "t", Key: "k"}, outbox.Message{Topic: "t", Key: "k"}, outbox.Message{Topic: "t"})
	// The age grows on the store's clock (poll: a store counts whole
	// milliseconds).
	var b outbox.Backlog
	for deadline := time.Now().Add(10 * time.Second); ; {
		b = measure()
		if b.Age >= 20*time.Millisecond || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if b.Pending != 3 || b.Age < 20*time.Millisecond || b.Oldest.IsZero() {
		t.Fatalf("three pending: Backlog %+v, want 3 and an age that grows", b)
	}
	batch := claim(t, h.Store, 10)
	msgs := batch.Messages()
	if len(msgs) != 2 {
		t.Fatalf("claimed %d messages, want the key's head and the keyless one", len(msgs))
	}
	if !b.Oldest.Equal(msgs[0].CreatedAt) {
		t.Fatalf("Oldest %v, want the first message's CreatedAt %v", b.Oldest, msgs[0].CreatedAt)
	}
	if got := measure(); got.Pending != 3 {
		t.Fatalf("claimed, not sent: Backlog %+v, want 3 pending", got)
	}
	if err := batch.MarkSent(t.Context(), []string{msgs[0].ID, msgs[1].ID}); err != nil {
		t.Fatalf("MarkSent: %v", err)
	}
	if got := measure(); got.Pending != 1 || got.Oldest.IsZero() || got.Age < 0 {
		t.Fatalf("two sent: Backlog %+v, want 1 pending", got)
	}
	claimIDs(t, h.Store, 10, true)
	if got := measure(); got != (outbox.Backlog{}) {
		t.Fatalf("all sent: Backlog %+v, want zero", got)
	}
}

// WithHeaders returns a Store whose claimed messages carry headers on top
// of their own: pending rows as a producer wrote them that Add would now
// refuse (an older build's reserved header names), to test what a relay
// does with them.
func WithHeaders(s outbox.Store, headers map[string]string) outbox.Store {
	return withHeaders{s, headers}
}

type withHeaders struct {
	outbox.Store
	headers map[string]string
}

func (s withHeaders) Claim(ctx context.Context, limit int) (outbox.Batch, error) {
	b, err := s.Store.Claim(ctx, limit)
	if err != nil {
		return nil, err
	}
	return headerBatch{b, s.headers}, nil
}

type headerBatch struct {
	outbox.Batch
	headers map[string]string
}

func (b headerBatch) Messages() []outbox.Message {
	ms := b.Batch.Messages()
	for i := range ms {
		h := maps.Clone(ms[i].Headers)
		if h == nil {
			h = map[string]string{}
		}
		maps.Copy(h, b.headers)
		ms[i].Headers = h
	}
	return ms
}
