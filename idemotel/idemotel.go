package idemotel

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of idemotel's tracer.
const ScopeName = "github.com/idemkit/idem/idemotel"

// The attribute keys of idem's spans and span events.
const (
	AttrKind    = attribute.Key("idem.kind")
	AttrOp      = attribute.Key("idem.op")
	AttrOutcome = attribute.Key("idem.outcome")
	AttrRoute   = attribute.Key("idem.route")
	AttrStore   = attribute.Key("idem.store")
	AttrKeyHash = attribute.Key("idem.key_hash")
	AttrN       = attribute.Key("idem.n")
	AttrAgeMS   = attribute.Key("idem.age_ms")
)

// Options configures New. A nil *Options means the defaults.
type Options struct {
	// Propagator reads a message's trace context from its headers (see
	// the package doc). Default: the global propagator
	// (otel.GetTextMapPropagator) if one was set, W3C trace context
	// otherwise.
	Propagator propagation.TextMapPropagator
}

// New returns an idem.Observer that records spans with tp's tracer (nil:
// the global TracerProvider).
func New(tp trace.TracerProvider, opts *Options) idem.Observer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	return &observer{tracer: tp.Tracer(ScopeName), prop: o.Propagator}
}

type observer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator // nil: propagator()
}

// started is the context Start returns (the span's, marked): its End
// ends the span. Being the context itself, it costs one allocation
// where a context.WithValue would add a second.
type started struct {
	context.Context
	span  trace.Span
	kind  idem.Kind
	op    string
	ended atomic.Bool
}

func (s *started) Value(key any) any {
	if key == (startedKey{}) {
		return s
	}
	return s.Context.Value(key)
}

type startedKey struct{}

// Start implements idem.Observer: it starts the operation's span.
func (o *observer) Start(ctx context.Context, e idem.Event) context.Context {
	opts := make([]trace.SpanStartOption, 0, 3)
	opts = append(opts, trace.WithAttributes(startAttrs(e)...))
	switch e.Kind {
	case idem.KindInbox:
		opts = append(opts, trace.WithSpanKind(trace.SpanKindConsumer))
		if len(e.Headers) > 0 {
			prop := o.prop
			if prop == nil {
				prop = propagator()
			}
			sc := trace.SpanContextFromContext(prop.Extract(context.Background(), carrier(e.Headers)))
			switch {
			case !sc.IsValid():
			case trace.SpanContextFromContext(ctx).IsValid():
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			default:
				ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
			}
		}
	case idem.KindOutbox:
		if e.Op == idem.OpPublish {
			opts = append(opts, trace.WithSpanKind(trace.SpanKindProducer))
		}
	}
	ctx, span := o.tracer.Start(ctx, spanName(e), opts...)
	return &started{Context: ctx, span: span, kind: e.Kind, op: e.Op}
}

// End implements idem.Observer: it ends the span of the operation Start
// began in ctx, or adds an event to ctx's span for an instant.
func (o *observer) End(ctx context.Context, e idem.Event) {
	if s, ok := ctx.Value(startedKey{}).(*started); ok && s.kind == e.Kind && s.op == e.Op && s.ended.CompareAndSwap(false, true) {
		span := s.span
		a := endAttrs(e, nil)
		if e.KeyHash != "" {
			// The key is known at the end: a request's Start comes
			// before its key is read, a store call's carries none.
			a = append(a, AttrKeyHash.String(e.KeyHash))
		}
		span.SetAttributes(a...)
		if e.Err != nil {
			span.RecordError(e.Err)
			span.SetStatus(codes.Error, e.Err.Error())
		}
		span.End()
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := endAttrs(e, startAttrs(e))
	if e.Err != nil {
		attrs = append(attrs, attribute.String("error.message", e.Err.Error()))
	}
	span.AddEvent(spanName(e), trace.WithAttributes(attrs...))
}

// spanName is "idem." and the kind, and the operation if any:
// "idem.store.acquire"; an inbox's is "idem.inbox.handle".
func spanName(e idem.Event) string {
	switch {
	case e.Op != "":
		return "idem." + e.Kind.String() + "." + e.Op
	case e.Kind == idem.KindInbox:
		return "idem.inbox.handle"
	}
	return "idem." + e.Kind.String()
}

// startAttrs are the attributes an event has from its start.
func startAttrs(e idem.Event) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, 5) // as many as there can be
	a = append(a, AttrKind.String(e.Kind.String()))
	if e.Op != "" {
		a = append(a, AttrOp.String(e.Op))
	}
	if e.Route != "" {
		a = append(a, AttrRoute.String(e.Route))
	}
	if e.Store != "" {
		a = append(a, AttrStore.String(e.Store))
	}
	if e.KeyHash != "" {
		a = append(a, AttrKeyHash.String(e.KeyHash))
	}
	return a
}

// endAttrs appends to a what an event has at its end.
func endAttrs(e idem.Event, a []attribute.KeyValue) []attribute.KeyValue {
	if e.Outcome != "" {
		a = append(a, AttrOutcome.String(e.Outcome))
	}
	if e.N != 0 {
		a = append(a, AttrN.Int64(e.N))
	}
	if e.Age != 0 {
		a = append(a, AttrAgeMS.Int64(e.Age.Milliseconds()))
	}
	return a
}

// propagator is the global propagator if one was set (it has fields),
// W3C trace context otherwise.
func propagator() propagation.TextMapPropagator {
	if p := otel.GetTextMapPropagator(); len(p.Fields()) > 0 {
		return p
	}
	return propagation.TraceContext{}
}

// Inject writes the trace context of ctx into headers (W3C traceparent
// and tracestate, or the fields of the global propagator if one was set)
// and returns them: a nil map is made when there is something to write.
// Call it on an outbox message's headers before adding the message, so
// that its consumer's span joins the trace.
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	if headers == nil {
		headers = map[string]string{}
	}
	propagator().Inject(ctx, carrier(headers))
	return headers
}

// carrier is a propagation.TextMapCarrier over message headers whose
// names a broker may have recased ("Traceparent"): Get finds a name in
// any case.
type carrier map[string]string

func (c carrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (c carrier) Set(key, value string) { c[key] = value }

func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
