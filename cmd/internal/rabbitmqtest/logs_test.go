package rabbitmqtest

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/rabbitmq"
)

// TestConsumerLogsHashIDs: the lines the consumer logs about a message
// (its requeues, its dead-lettering) identify it by idem.key_hash, the
// hash of its ID that the inbox's Observer events carry, and never by
// the ID itself.
func TestConsumerLogsHashIDs(t *testing.T) {
	t.Parallel()
	const id = "poison-ID-7712"
	b := newBroker(t, nil)
	st := sqliteStore(t)
	in := st.inbox(t, inbox.Config{MaxAttempts: 2, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		return errors.New("cannot decode payload")
	}
	var buf obstest.LogBuffer
	cfg := b.consumerConfig()
	cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b.publish(t, id, "{")
	run(t, cfg, rabbitmq.HandleTx(in, st.db, h))
	eventually(t, 30*time.Second, "the dead-lettered message", func() bool { n, _ := b.depth(t, b.dlq); return n == 1 })
	eventually(t, 10*time.Second, "the dead-lettering logged", func() bool {
		return strings.Contains(buf.String(), "rabbitmq: dead message dead-lettered")
	})
	out := buf.String()
	for _, want := range []string{"rabbitmq: requeueing", `"idem.key_hash":"` + idem.HashKey("", id) + `"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, id) {
		t.Errorf("the message ID in the log:\n%s", out)
	}
}
