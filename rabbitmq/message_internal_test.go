package rabbitmq

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// FuzzMessage checks the inbox's view of a delivery: the ID is its
// message_id, the topic its routing key, the payload its body as sent,
// the key the idem-key header (a string or bytes), every header a string
// (numbers in decimal, times in RFC 3339 UTC, a void value empty), and
// amqp-redelivered always the broker's flag, whatever a publisher sent
// under that name.
func FuzzMessage(f *testing.F) {
	f.Add("out-01", "order.paid", "order-1", false, "event", "paid", []byte("x"), int64(7), int64(1_700_000_000), true, []byte(`{"id":1}`))
	f.Add("", "", "", true, HeaderRedelivered, "false", []byte(nil), int64(-1), int64(0), false, []byte(nil))
	f.Add("\xff", "a", "\x00", false, HeaderKey, "k2", []byte("\xff"), int64(0), int64(-62135596800), true, []byte{0})
	f.Fuzz(func(t *testing.T, id, routingKey, key string, keyAsBytes bool, name, value string, raw []byte, n, unix int64, redelivered bool, body []byte) {
		h := amqp.Table{name: value, "x-bytes": raw, "x-int": n, "x-time": time.Unix(unix, 0), "x-void": nil}
		if key != "" {
			if keyAsBytes {
				h[HeaderKey] = []byte(key)
			} else {
				h[HeaderKey] = key
			}
		}
		d := amqp.Delivery{MessageId: id, RoutingKey: routingKey, Headers: h, Redelivered: redelivered, Body: body}
		m := message(d)
		if m.ID != id || m.Topic != routingKey || !bytes.Equal(m.Payload, body) {
			t.Fatalf("delivery (%q, %q, %q) read as (%q, %q, %q)", id, routingKey, body, m.ID, m.Topic, m.Payload)
		}
		if m.Headers[HeaderRedelivered] != strconv.FormatBool(redelivered) {
			t.Fatalf("%s = %q, the broker's flag is %v", HeaderRedelivered, m.Headers[HeaderRedelivered], redelivered)
		}
		wantKey := key
		if key == "" && name == HeaderKey {
			wantKey = value
		}
		if m.Key != wantKey || m.Headers[HeaderKey] != m.Key && (key != "" || name == HeaderKey) {
			t.Fatalf("key %q read as %q (header %q)", wantKey, m.Key, m.Headers[HeaderKey])
		}
		for hn, want := range map[string]string{"x-bytes": string(raw), "x-int": strconv.FormatInt(n, 10),
			"x-time": time.Unix(unix, 0).UTC().Format(time.RFC3339), "x-void": ""} {
			if name == hn {
				want = value
			}
			if got, ok := m.Headers[hn]; !ok || got != want {
				t.Fatalf("header %s = %q, %v; want %q", hn, got, ok, want)
			}
		}
		if name != HeaderRedelivered && (name != HeaderKey || key == "") && m.Headers[name] != value {
			t.Fatalf("header %q = %q, want %q", name, m.Headers[name], value)
		}
	})
}
