// Package tracing exports the spans of shopd and idem proxy over OTLP/HTTP
// when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
// is set, unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn
// it off; the exporter reads the other OTEL_EXPORTER_OTLP_* variables
// (headers, timeout, insecure, compression) itself.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// Tracing is a running export, or nil when none is configured: its
// methods do nothing on nil.
type Tracing struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	obs    idem.Observer
}

// Enabled reports whether the environment asks for an export: an OTLP
// endpoint is set (blanks around it are the exporter's to trim, and a
// value of blanks only is not set), and the export is not turned off by
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none, which
// OpenTelemetry's SDKs honour and this exporter does not read itself.
func Enabled() bool {
	return !turnedOff() && (env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "")
}

// env is the variable name's value without the blanks around it, as the
// exporter reads it.
func env(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// turnedOff reports whether OTEL_SDK_DISABLED is true (in any case) or
// OTEL_TRACES_EXPORTER is none.
func turnedOff() bool {
	return strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(env("OTEL_TRACES_EXPORTER"), "none")
}

// Start starts the export of service's spans when Enabled, and makes its
// TracerProvider and the W3C propagator the global ones; nil, nil when
// not Enabled.
func Start(ctx context.Context, service string) (*Tracing, error) {
	if !Enabled() {
		return nil, nil
	}
	if err := CheckEnv(); err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	res := resource.NewSchemaless(attribute.String("service.name", service))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return &Tracing{tp: tp, tracer: tp.Tracer(service), obs: idemotel.New(tp, nil)}, nil
}

// CheckEnv returns an error naming the variable when the endpoint the
// exporter would use (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT when set, which
// replaces OTEL_EXPORTER_OTLP_ENDPOINT, else the latter) is not an http
// or https URL with a host, or when OTEL_TRACES_EXPORTER names another
// exporter than otlp (or none). The exporter would log a malformed
// endpoint and send to its default (localhost:4318) instead: spans would
// go nowhere while the program looked fine. Start checks it; the
// programs check it with their flags too, so that it is a configuration
// error (exit status 2) found before any data is touched. An export
// turned off (OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none) is not
// checked: its endpoints are not used.
func CheckEnv() error {
	if turnedOff() {
		return nil
	}
	if v := env("OTEL_TRACES_EXPORTER"); v != "" && !strings.EqualFold(v, "otlp") {
		return fmt.Errorf("OTEL_TRACES_EXPORTER=%s: this program exports spans over OTLP only (otlp), or not at all (none)", v)
	}
	name := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	if env(name) == "" {
		name = "OTEL_EXPORTER_OTLP_ENDPOINT"
	}
	return checkEndpoint(name, env(name))
}

// checkEndpoint returns an error naming the variable name if its value v
// is set and is not an http or https URL with a host.
func checkEndpoint(name, v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("%s is not a URL (%v); give e.g. http://127.0.0.1:4318", name, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s=%s is not an http:// or https:// URL with a host; give e.g. http://127.0.0.1:4318", name, u.Redacted())
	}
	return nil
}

// Observer returns the idem.Observer that records idem's spans (nil when
// t is nil).
func (t *Tracing) Observer() idem.Observer {
	if t == nil {
		return nil
	}
	return t.obs
}

// Handler wraps h with a server span per request, a child of the
// caller's trace context (traceparent), named by the method (the path
// may hold IDs: it is not recorded). A method that is not one of HTTP's
// own is any string a client sends: its span is named "HTTP" and its
// http.request.method is "_OTHER" (OpenTelemetry's semantic
// conventions), so that span names stay a bounded set.
func (t *Tracing) Handler(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	prop := otel.GetTextMapPropagator()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		name, method := r.Method, r.Method
		if !knownMethod(method) {
			name, method = "HTTP", "_OTHER"
		}
		ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", method)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(sw.status))
		}
	})
}

// knownMethod reports whether m is one of the methods of RFC 9110 or
// PATCH.
func knownMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// Shutdown flushes the spans not yet exported and stops the export.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.NewResponseController reach the writer's Flush and
// deadlines.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
