package idemotel_test

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/inbox"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// An inbox reports to idemotel's Observer: the message's handling is a
// span, in the trace of the producer that injected its context.
func Example() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	// The producer, in a traced request, before outbox Add.
	ctx, request := tp.Tracer("shop").Start(context.Background(), "POST /orders")
	headers := idemotel.Inject(ctx, nil)
	request.End()

	// The consumer.
	in, _ := inbox.New(inbox.NewMemoryStore(), &inbox.Config{Group: "billing", Observer: idemotel.New(tp, nil)})
	_, _ = in.Handle(context.Background(), inbox.Message{ID: "42", Headers: headers}, func(context.Context, inbox.Delivery) error { return nil })

	spans := rec.Ended()
	handle := spans[len(spans)-1]
	fmt.Println(handle.Name(), handle.SpanContext().TraceID() == request.SpanContext().TraceID())
	// Output: idem.inbox.handle true
}
