// Package obsbench holds the benchmark of idemhttp's middleware with
// metrics (idemprom) and tracing (idemotel) on against off. It lives in
// the cmd module, which requires both adapters and the OpenTelemetry SDK.
// The package has no code of its own.
package obsbench
