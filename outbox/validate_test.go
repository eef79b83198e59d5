package outbox_test

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/outbox"
)

// FuzzValidate: a message Validate accepts is published as it was added.
// Its headers survive the JSON the SQL stores keep them in, and its
// header values and key (carried in the Idem-Key header) hold no line
// break and no space or tab at either end, which NATS would replace or
// trim (natsjs's FuzzPublishedHeaders sends them through nats.go's own
// header decoder).
func FuzzValidate(f *testing.F) {
	f.Add("orders.paid", "order-1", "X-Tenant", "acme", "traceparent", "00-ab-cd-01")
	f.Add("t", "k", "Nats-Msg-Id", "x", "Idem-Key", "y")
	f.Fuzz(func(t *testing.T, topic, key, n1, v1, n2, v2 string) {
		m := outbox.Message{Topic: topic, Key: key, Headers: map[string]string{n1: v1, n2: v2}}
		if m.Validate() != nil {
			return
		}
		b, err := json.Marshal(m.Headers)
		if err != nil {
			t.Fatal(err)
		}
		var back map[string]string
		if err := json.Unmarshal(b, &back); err != nil || !maps.Equal(back, m.Headers) {
			t.Fatalf("headers %q stored as %s come back as %q, %v", m.Headers, b, back, err)
		}
		for _, v := range append(slices.Collect(maps.Values(m.Headers)), key) {
			if strings.ContainsAny(v, "\r\n") || strings.Trim(v, " \t") != v {
				t.Fatalf("accepted %q, which a NATS header does not carry as is", v)
			}
		}
	})
}
