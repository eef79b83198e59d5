package idemotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/outbox"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func setup(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.Emit()
		}
	}
	return ""
}

func byName(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			if found != nil {
				t.Fatalf("two spans named %s", name)
			}
			found = s
		}
	}
	if found == nil {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name())
		}
		t.Fatalf("no span %s among %q", name, names)
	}
	return found
}

// noRawKey fails if a span's attributes, or its events', hold one of raw.
func noRawKey(t *testing.T, spans []sdktrace.ReadOnlySpan, raw ...string) {
	t.Helper()
	for _, s := range spans {
		attrs := s.Attributes()
		for _, ev := range s.Events() {
			attrs = append(attrs, ev.Attributes...)
		}
		for _, a := range attrs {
			for _, r := range raw {
				if strings.Contains(a.Value.Emit(), r) {
					t.Errorf("span %s: attribute %s = %q holds %q", s.Name(), a.Key, a.Value.Emit(), r)
				}
			}
		}
	}
}

// TestRequestSpans: a request's span, with its store calls as children
// carrying their outcomes, and an instant as an event of the request's
// span. The guard reports this sequence.
func TestRequestSpans(t *testing.T) {
	t.Parallel()
	rec, tp := setup(t)
	obs := idemotel.New(tp, nil)
	hash := idem.HashKey("tenant-7", "order-key-123")
	req := idem.Event{Kind: idem.KindRequest, Route: "POST /orders", Store: "memory", KeyHash: hash}
	ctx := obs.Start(context.Background(), req)
	for _, op := range []string{idem.OpAcquire, idem.OpComplete} {
		st := idem.Event{Kind: idem.KindStore, Op: op, Store: "memory", KeyHash: hash}
		sctx := obs.Start(ctx, st)
		st.Outcome = idem.OutcomeOK
		obs.End(sctx, st)
	}
	obs.End(ctx, idem.Event{Kind: idem.KindLease, Outcome: idem.OutcomeRenewed})
	req.Outcome = idem.OutcomeExecuted
	obs.End(ctx, req)
	// A second End on the same context ends nothing more (the span,
	// ended, records no event either).
	obs.End(ctx, req)

	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the request and two store calls", len(spans))
	}
	r := byName(t, spans, "idem.request")
	for _, name := range []string{"idem.store.acquire", "idem.store.complete"} {
		s := byName(t, spans, name)
		if s.Parent().SpanID() != r.SpanContext().SpanID() || s.SpanContext().TraceID() != r.SpanContext().TraceID() {
			t.Errorf("%s is not a child of the request's span", name)
		}
		if attr(s, idemotel.AttrOutcome) != "ok" || attr(s, idemotel.AttrStore) != "memory" || attr(s, idemotel.AttrKeyHash) != hash {
			t.Errorf("%s attributes %v", name, s.Attributes())
		}
	}
	if attr(r, idemotel.AttrOutcome) != "executed" || attr(r, idemotel.AttrRoute) != "POST /orders" || attr(r, idemotel.AttrKind) != "request" {
		t.Errorf("request attributes %v", r.Attributes())
	}
	if r.Status().Code == codes.Error {
		t.Errorf("request status %v", r.Status())
	}
	if evs := r.Events(); len(evs) != 1 || evs[0].Name != "idem.lease" {
		t.Errorf("request events %+v, want the lease's instant", evs)
	}
	noRawKey(t, spans, "order-key-123", "tenant-7")
}

func TestErrorStatus(t *testing.T) {
	t.Parallel()
	rec, tp := setup(t)
	obs := idemotel.New(tp, nil)
	e := idem.Event{Kind: idem.KindStore, Op: idem.OpAcquire, Store: "postgres"}
	ctx := obs.Start(context.Background(), e)
	e.Outcome, e.Err = idem.OutcomeError, errors.New("connection refused")
	obs.End(ctx, e)
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Status().Code != codes.Error || spans[0].Status().Description != "connection refused" {
		t.Fatalf("spans %v, want one with an error status", spans)
	}
	if evs := spans[0].Events(); len(evs) != 1 || evs[0].Name != "exception" {
		t.Fatalf("events %+v, want the recorded error", evs)
	}
	// An instant without a recording span is dropped, not a panic.
	obs.End(context.Background(), idem.Event{Kind: idem.KindLock, Op: idem.OpExtend, Outcome: idem.OutcomeLost})
}

// TestOutboxToInbox: a message added in a traced request, relayed and
// handled by an inbox, is handled in a span of the producer's trace, a
// child of the producer's span, and the handler's spans are children of
// it.
func TestOutboxToInbox(t *testing.T) {
	t.Parallel()
	rec, tp := setup(t)
	obs := idemotel.New(tp, nil)
	tracer := tp.Tracer("test")
	ctx := context.Background()

	// The producer: a request that adds a message.
	pctx, producer := tracer.Start(ctx, "POST /orders")
	store := outbox.NewMemoryStore("m-")
	msg := outbox.Message{Topic: "order.paid", Key: "order-1"}
	msg.Headers = idemotel.Inject(pctx, msg.Headers)
	id, err := store.Add(pctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	producer.End()

	// The consumer, behind a publisher standing for the broker: its
	// context has no span.
	in, err := inbox.New(inbox.NewMemoryStore(), &inbox.Config{Group: "billing", Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	var handled int
	broker := outbox.PublisherFunc(func(_ context.Context, m outbox.Message) error {
		_, err := in.Handle(context.Background(), inbox.Message{ID: m.ID, Topic: m.Topic, Key: m.Key, Headers: m.Headers}, func(ctx context.Context, d inbox.Delivery) error {
			_, span := tracer.Start(ctx, "charge")
			span.End()
			handled++
			return nil
		})
		return err
	})
	relay, err := outbox.NewRelay(store, broker, &outbox.RelayConfig{Observer: obs, Name: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Once(ctx); n != 1 || err != nil || handled != 1 {
		t.Fatalf("Once = %d, %v; handled %d", n, err, handled)
	}

	spans := rec.Ended()
	p := byName(t, spans, "POST /orders")
	h := byName(t, spans, "idem.inbox.handle")
	c := byName(t, spans, "charge")
	pub := byName(t, spans, "idem.outbox.publish")
	if h.SpanContext().TraceID() != p.SpanContext().TraceID() || h.Parent().SpanID() != p.SpanContext().SpanID() || !h.Parent().IsRemote() {
		t.Fatalf("handle span in trace %s under %s, want the producer's %s under %s",
			h.SpanContext().TraceID(), h.Parent().SpanID(), p.SpanContext().TraceID(), p.SpanContext().SpanID())
	}
	if c.Parent().SpanID() != h.SpanContext().SpanID() {
		t.Fatal("the handler's span is not a child of the handle span")
	}
	if h.SpanKind() != trace.SpanKindConsumer || attr(h, idemotel.AttrOutcome) != "processed" || attr(h, idemotel.AttrRoute) != "billing" {
		t.Fatalf("handle span %v %v", h.SpanKind(), h.Attributes())
	}
	if pub.SpanKind() != trace.SpanKindProducer || attr(pub, idemotel.AttrN) != "1" || attr(pub, idemotel.AttrRoute) != "orders" {
		t.Fatalf("publish span %v %v", pub.SpanKind(), pub.Attributes())
	}
	noRawKey(t, spans, id, "order-1")
}

// TestLinkedWhenTheConsumerHasASpan: a consumer whose context has a span
// of its own keeps it as the parent and links the producer's span; a
// header recased by a broker is read all the same.
func TestLinkedWhenTheConsumerHasASpan(t *testing.T) {
	t.Parallel()
	rec, tp := setup(t)
	obs := idemotel.New(tp, nil)
	tracer := tp.Tracer("test")
	pctx, producer := tracer.Start(context.Background(), "producer")
	h := idemotel.Inject(pctx, nil)
	producer.End()
	recased := map[string]string{"Traceparent": h["traceparent"]}
	if recased["Traceparent"] == "" {
		t.Fatalf("Inject wrote %v, want a traceparent", h)
	}
	cctx, receive := tracer.Start(context.Background(), "receive")
	ctx := obs.Start(cctx, idem.Event{Kind: idem.KindInbox, Route: "g", Headers: recased})
	obs.End(ctx, idem.Event{Kind: idem.KindInbox, Route: "g", Outcome: idem.OutcomeDuplicate})
	receive.End()

	spans := rec.Ended()
	hs, rs, ps := byName(t, spans, "idem.inbox.handle"), byName(t, spans, "receive"), byName(t, spans, "producer")
	if hs.Parent().SpanID() != rs.SpanContext().SpanID() {
		t.Fatal("the handle span is not the receive span's child")
	}
	if l := hs.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != ps.SpanContext().SpanID() || l[0].SpanContext.TraceID() != ps.SpanContext().TraceID() {
		t.Fatalf("links %+v, want the producer's span", hs.Links())
	}
	// Without a span, Inject writes nothing.
	if got := idemotel.Inject(context.Background(), nil); got != nil {
		t.Fatalf("Inject without a span = %v", got)
	}
}

// TestKeyHashFromEnd: the callers know the key only at the end (idemhttp
// starts a request's span before reading its key; ObserveStore's Start
// carries none): the KeyHash of the End is the span's idem.key_hash.
func TestKeyHashFromEnd(t *testing.T) {
	t.Parallel()
	rec, tp := setup(t)
	obs := idemotel.New(tp, nil)
	hash := idem.HashKey("tenant-7", "order-key-123")
	req := idem.Event{Kind: idem.KindRequest, Route: "POST /orders", Store: "memory"}
	ctx := obs.Start(context.Background(), req)
	st := idem.Event{Kind: idem.KindStore, Op: idem.OpAcquire, Store: "memory"}
	sctx := obs.Start(ctx, st)
	st.Outcome, st.KeyHash = idem.OutcomeOK, hash
	obs.End(sctx, st)
	req.Outcome, req.KeyHash = idem.OutcomeExecuted, hash
	obs.End(ctx, req)
	for _, name := range []string{"idem.request", "idem.store.acquire"} {
		if s := byName(t, rec.Ended(), name); attr(s, idemotel.AttrKeyHash) != hash {
			t.Errorf("%s: idem.key_hash %q, want %s (attributes %v)", name, attr(s, idemotel.AttrKeyHash), hash, s.Attributes())
		}
	}
}
