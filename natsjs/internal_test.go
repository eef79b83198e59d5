package natsjs

import (
	"bytes"
	"fmt"
	"net/textproto"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
)

func TestTermReasonSupported(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{
		"2.9.10": false, "2.10.3": false, "2.10.4": true, "2.10.22": true, "2.11.0": true,
		"v2.12.1-beta.2": true, "3.0.0": true, "1.4.1": false, "": false, "garbage": false,
	} {
		if got := termReasonSupported(v); got != want {
			t.Errorf("termReasonSupported(%q) = %v, want %v", v, got, want)
		}
	}
}

// FuzzTermReasonSupported: a server version X.Y.Z, with or without a
// leading v and a pre-release suffix, honours TermWithReason exactly when
// it is 2.10.4 or later; any other text is answered without a panic.
func FuzzTermReasonSupported(f *testing.F) {
	f.Add(uint16(2), uint16(10), uint16(4), "", false, "garbage")
	f.Add(uint16(2), uint16(10), uint16(3), "beta.2", true, "2.10")
	f.Add(uint16(3), uint16(0), uint16(0), "", true, "2-beta.11.0")
	f.Fuzz(func(t *testing.T, major, minor, patch uint16, pre string, v bool, raw string) {
		_ = termReasonSupported(raw)
		s := fmt.Sprintf("%d.%d.%d", major, minor, patch)
		if pre != "" {
			s += "-" + pre
		}
		if v {
			s = "v" + s
		}
		want := major > 2 || major == 2 && (minor > 10 || minor == 10 && patch >= 4)
		if got := termReasonSupported(s); got != want {
			t.Fatalf("termReasonSupported(%q) = %v, want %v", s, got, want)
		}
	})
}

// FuzzMessageIDs: the fallback ID of a message without one, and the
// Nats-Msg-Id of a dead letter, are valid inbox IDs whenever the stream
// and durable names are UTF-8 without control characters, and name one
// message each: two messages with different stream, sequence or
// timestamp never share a fallback ID, and two dead letters of one stream
// never share an ID.
func FuzzMessageIDs(f *testing.F) {
	f.Add("ORDERS", uint64(1), int64(1_700_000_000_000_000_000), "c", "ORDERS", uint64(1), int64(1_700_000_000_000_000_000), "c")
	f.Add("a:1", uint64(2), int64(3), "d", "a", uint64(1), int64(2), "d:1")
	f.Add(strings.Repeat("s", 240), uint64(1), int64(-1), strings.Repeat("d", 200), "x", uint64(0), int64(0), "y")
	f.Fuzz(func(t *testing.T, s1 string, q1 uint64, ts1 int64, d1 string, s2 string, q2 uint64, ts2 int64, d2 string) {
		meta := func(stream string, seq uint64, ts int64) *jetstream.MsgMetadata {
			m := &jetstream.MsgMetadata{Stream: stream, Timestamp: time.Unix(0, ts)}
			m.Sequence.Stream = seq
			return m
		}
		m1, m2 := meta(s1, q1, ts1), meta(s2, q2, ts2)
		id1, id2 := seqID(m1), seqID(m2)
		dl1 := deadLetterID(m1, d1)
		if inbox.Validate(s1) == nil && (d1 == "" || inbox.Validate(d1) == nil) {
			if err := inbox.Validate(id1); err != nil {
				t.Fatalf("seqID of stream %q = %q: %v", s1, id1, err)
			}
			if err := inbox.Validate(dl1); err != nil {
				t.Fatalf("deadLetterID of %q, %q = %q: %v", s1, d1, dl1, err)
			}
		}
		sameMsg := s1 == s2 && q1 == q2 && ts1 == ts2
		if (id1 == id2) != sameMsg {
			t.Fatalf("(%q, %d, %d) and (%q, %d, %d): fallback IDs %q and %q", s1, q1, ts1, s2, q2, ts2, id1, id2)
		}
		dl3 := deadLetterID(meta(s1, q2, ts2), d2)
		if (dl1 == dl3) != (q1 == q2 && ts1 == ts2 && d1 == d2) {
			t.Fatalf("stream %q: (%q, %d, %d) and (%q, %d, %d): dead-letter IDs %q and %q", s1, d1, q1, ts1, d2, q2, ts2, dl1, dl3)
		}
	})
}

// FuzzSubjectMatches derives patterns from a literal subject: the subject
// itself, any of its tokens replaced by '*', and any non-empty tail
// replaced by '>' match it; a pattern with one token changed, one more or
// one less does not.
func FuzzSubjectMatches(f *testing.F) {
	f.Add("orders.paid.eu", uint64(0b010), uint8(2), "x")
	f.Add("a", uint64(1), uint8(0), "*")
	f.Add("dead.letters", uint64(0), uint8(1), ">")
	f.Fuzz(func(t *testing.T, subject string, stars uint64, tail uint8, other string) {
		if literalSubject(subject) != nil || literalSubject(other) != nil || strings.Contains(other, ".") {
			return
		}
		toks := strings.Split(subject, ".")
		pat := slices.Clone(toks)
		for i := range pat {
			if stars&(1<<(i%64)) != 0 {
				pat[i] = "*"
			}
		}
		if !SubjectMatches(strings.Join(pat, "."), subject) {
			t.Fatalf("%q does not match %q", strings.Join(pat, "."), subject)
		}
		if cut := int(tail) % len(toks); true {
			p := strings.Join(append(slices.Clone(pat[:cut]), ">"), ".")
			if !SubjectMatches(p, subject) {
				t.Fatalf("%q does not match %q", p, subject)
			}
		}
		changed := slices.Clone(pat)
		i := int(tail) % len(toks)
		if other != toks[i] {
			changed[i] = other
			if p := strings.Join(changed, "."); SubjectMatches(p, subject) {
				t.Fatalf("%q matches %q", p, subject)
			}
		}
		for _, p := range []string{strings.Join(append(slices.Clone(pat), "*"), "."), strings.Join(pat[:len(pat)-1], ".")} {
			if p != "" && SubjectMatches(p, subject) {
				t.Fatalf("%q matches %q", p, subject)
			}
		}
		if SubjectMatches(subject+".>", subject) {
			t.Fatalf("%q.> matches %q", subject, subject)
		}
	})
}

// fakeMsg is a JetStream message with the given subject, headers, data
// and metadata; its other methods are not called.
type fakeMsg struct {
	jetstream.Msg
	subject string
	header  nats.Header
	data    []byte
	meta    *jetstream.MsgMetadata
}

func (m *fakeMsg) Subject() string                           { return m.subject }
func (m *fakeMsg) Headers() nats.Header                      { return m.header }
func (m *fakeMsg) Data() []byte                              { return m.data }
func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.meta, nil }

// FuzzMessage checks the inbox's view of a JetStream message: the ID is
// its Nats-Msg-Id when it has one and the fallback ID otherwise, the
// topic its subject, the key its Idem-Key, the payload its data as sent,
// and each header its first value.
func FuzzMessage(f *testing.F) {
	f.Add("orders.paid", "id-1", "order-1", "Event", "paid", "second", []byte("p"), "ORDERS", uint64(7))
	f.Add("x", "", "", "", "", "", []byte(nil), "S", uint64(1))
	f.Add("x", "", "k", "Nats-Msg-Id", "", "", []byte{0}, "S:1", uint64(0))
	f.Fuzz(func(t *testing.T, subject, id, key, name, value, second string, data []byte, stream string, seq uint64) {
		h := nats.Header{}
		if name != "" {
			h[name] = []string{value, second}
		}
		if id != "" {
			h.Set(jetstream.MsgIDHeader, id)
		}
		if key != "" {
			h.Set(KeyHeader, key)
		}
		meta := &jetstream.MsgMetadata{Stream: stream, Timestamp: time.Unix(0, 1)}
		meta.Sequence.Stream = seq
		m, err := Message(&fakeMsg{subject: subject, header: h, data: data, meta: meta})
		if err != nil {
			t.Fatal(err)
		}
		wantID := h.Get(jetstream.MsgIDHeader)
		if wantID == "" {
			wantID = seqID(meta)
		}
		if m.ID != wantID || m.Topic != subject || m.Key != h.Get(KeyHeader) || !bytes.Equal(m.Payload, data) {
			t.Fatalf("message (%q, %q, %q, %q) read as (%q, %q, %q, %q)", wantID, subject, h.Get(KeyHeader), data, m.ID, m.Topic, m.Key, m.Payload)
		}
		for n, vs := range h {
			if m.Headers[n] != vs[0] {
				t.Fatalf("header %q = %q, want %q", n, m.Headers[n], vs[0])
			}
		}
		if len(m.Headers) != len(h) {
			t.Fatalf("headers %q from %q", m.Headers, h)
		}
	})
}

// FuzzPublishedHeaders: the headers and key of a message outbox.Validate
// accepts arrive as they were added. The header block is written as
// nats.go writes it (the value trimmed, its line breaks replaced by
// spaces, see its writeHeaderValue) and read back by nats.go's own
// decoder.
func FuzzPublishedHeaders(f *testing.F) {
	f.Add("k", "X-Tenant", "acme", "traceparent", "00-ab-cd-01")
	f.Add("k", "x", "a\x00b", "y", "\u2028")
	f.Fuzz(func(t *testing.T, key, n1, v1, n2, v2 string) {
		m := outbox.Message{ID: "id", Topic: "t", Key: key, Headers: map[string]string{n1: v1, n2: v2}}
		if m.Validate() != nil {
			return
		}
		h := nats.Header{}
		for k, v := range m.Headers {
			h.Set(k, v)
		}
		if m.Key != "" {
			h.Set(KeyHeader, m.Key)
		}
		block := "NATS/1.0\r\n"
		clean := strings.NewReplacer("\r", " ", "\n", " ")
		for k, vs := range h {
			for _, v := range vs {
				block += k + ": " + clean.Replace(textproto.TrimString(v)) + "\r\n"
			}
		}
		got, err := nats.DecodeHeadersMsg([]byte(block + "\r\n"))
		if err != nil {
			t.Fatalf("%q: %v", block, err)
		}
		for k, v := range m.Headers {
			if got.Get(k) != v {
				t.Fatalf("header %q = %q arrives as %q", k, v, got.Get(k))
			}
		}
		if got.Get(KeyHeader) != m.Key {
			t.Fatalf("key %q arrives as %q", m.Key, got.Get(KeyHeader))
		}
	})
}
