package natsjstest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/natsjs"
)

// TestConsumerLogsHashIDs: the line the consumer logs about a delivery
// whose Process failed identifies the message by idem.key_hash, the hash
// of its ID that the inbox's Observer events carry, and never by the ID.
func TestConsumerLogsHashIDs(t *testing.T) {
	t.Parallel()
	const id = "order-ID-30517"
	e := setup(t, 0)
	var buf obstest.LogBuffer
	var calls atomic.Int64
	p := func(ctx context.Context, m inbox.Message) (inbox.Outcome, error) {
		if calls.Add(1) == 1 {
			return inbox.Outcome{Result: inbox.Retry}, errors.New("store down")
		}
		return inbox.Outcome{Result: inbox.Processed}, nil
	}
	c := newConsumer(t, e, p, natsjs.Config{
		Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	run(t, c)
	e.publish(t, "a", id, "x")
	obstest.WaitFor(t, "the message processed after a retry", func() bool { return calls.Load() >= 2 && settled(t, c) })
	out := buf.String()
	for _, want := range []string{"natsjs: store failed; retrying", `"idem.key_hash":"` + idem.HashKey("", id) + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, id) {
		t.Errorf("the message ID in the log:\n%s", out)
	}
}

// TestConsumerWarnsDeadLettersUncaptured: NewConsumer says at once that
// no stream captures its dead-letter subject (a dead message would be
// held until one does), and says nothing when one does.
func TestConsumerWarnsDeadLettersUncaptured(t *testing.T) {
	t.Parallel()
	e := setup(t, 0)
	const warning = "natsjs: no stream captures the dead-letter subject"
	for _, tc := range []struct {
		subject string
		warned  bool
	}{
		{"", false}, // the default, which setup's dead-letter stream captures
		{"nowhere." + e.subject, true},
	} {
		var buf obstest.LogBuffer
		newConsumer(t, e, func(context.Context, inbox.Message) (inbox.Outcome, error) {
			return inbox.Outcome{Result: inbox.Processed}, nil
		}, natsjs.Config{DeadLetterSubject: tc.subject, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if got := strings.Contains(buf.String(), warning); got != tc.warned {
			t.Errorf("DeadLetterSubject %q: warned %v, want %v; log:\n%s", tc.subject, got, tc.warned, buf.String())
		}
	}
}
