package natsjstest

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/sqlstore"
)

// TestTraceAcrossTheBroker: a message added to the outbox in a traced
// transaction, relayed through JetStream and handled by an inbox, is
// handled in a span of the producer's trace (a child of the producer's
// span), with the handler's effect committed once; no attribute holds the
// message's ID or key.
func TestTraceAcrossTheBroker(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs := idemotel.New(tp, nil)
	tracer := tp.Tracer("shop")
	e := setup(t, 0)

	// The producer: a traced request adds the message in its transaction.
	odb, _ := outboxOn(t, filepath.Join(t.TempDir(), "outbox.db"))
	ob, err := sqlstore.NewOutboxStore(odb, &sqlstore.OutboxConfig{Dialect: sqlstore.SQLite, IDPrefix: "shop-eu/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ob.Close() })
	ctx, request := tracer.Start(context.Background(), "POST /orders")
	tx, err := odb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := outbox.Message{Topic: e.subject + ".order.paid", Key: "order-77", Payload: []byte(`{}`)}
	msg.Headers = idemotel.Inject(ctx, msg.Headers)
	id, err := ob.Add(ctx, tx, msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	request.End()

	// The relay publishes it to the stream.
	pub, err := natsjs.NewPublisher(e.js, &natsjs.PublisherConfig{Stream: e.stream})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, pub, &outbox.RelayConfig{Observer: obs, Name: "orders", Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Once(context.Background()); n != 1 || err != nil {
		t.Fatalf("relay Once = %d, %v", n, err)
	}

	// The consumer handles it from the stream.
	db, _, in := sqliteInbox(t, inbox.Config{Observer: obs})
	var handlerTrace atomic.Value
	h := func(ctx context.Context, tx *sql.Tx, d inbox.Delivery) error {
		_, span := tracer.Start(ctx, "award points")
		handlerTrace.Store(span.SpanContext().TraceID().String())
		span.End()
		return effect(sqlstore.SQLite, "p")(ctx, tx, d)
	}
	c := newConsumer(t, e, natsjs.HandleTx(in, db, h), natsjs.Config{})
	stop := run(t, c)
	obstest.WaitFor(t, "the message's handling", func() bool {
		_, of := effects(t, db, sqlstore.SQLite, id)
		return of == 1 && settled(t, c)
	})
	stop()

	spans := rec.Ended()
	find := func(name string) sdktrace.ReadOnlySpan {
		t.Helper()
		for _, s := range spans {
			if s.Name() == name {
				return s
			}
		}
		t.Fatalf("no span %s", name)
		return nil
	}
	producer, handle, award := find("POST /orders"), find("idem.inbox.handle"), find("award points")
	publish := find("idem.outbox.publish")
	if handle.SpanContext().TraceID() != producer.SpanContext().TraceID() || handle.Parent().SpanID() != producer.SpanContext().SpanID() {
		t.Fatalf("the handle span is in trace %s under %s; want the producer's %s under %s",
			handle.SpanContext().TraceID(), handle.Parent().SpanID(), producer.SpanContext().TraceID(), producer.SpanContext().SpanID())
	}
	if award.Parent().SpanID() != handle.SpanContext().SpanID() || handlerTrace.Load() != producer.SpanContext().TraceID().String() {
		t.Fatal("the handler's span is not a child of the handle span")
	}
	outcome := ""
	for _, a := range handle.Attributes() {
		if a.Key == idemotel.AttrOutcome {
			outcome = a.Value.AsString()
		}
	}
	if outcome != "processed" {
		t.Fatalf("handle span attributes %v, want outcome processed", handle.Attributes())
	}
	if publish.Parent().IsValid() {
		t.Fatal("the relay's batch has a parent: the relay runs in no trace")
	}
	for _, s := range spans {
		for _, a := range s.Attributes() {
			if v := a.Value.Emit(); strings.Contains(v, id) || strings.Contains(v, "order-77") {
				t.Errorf("span %s: attribute %s = %q names the message", s.Name(), a.Key, v)
			}
		}
	}
}
