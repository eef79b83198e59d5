// Package idemclient is the client half of the Idempotency-Key contract:
// an http.RoundTripper that retries requests which are safe to retry
// because they carry an idempotency key.
//
//	client := &http.Client{Transport: &idemclient.Transport{}}
//	resp, err := client.Post(server.URL+"/orders", "application/json", strings.NewReader(`{"sku":"BOOK-1"}`))
//
// A covered request (POST and PATCH by default, as the idemhttp middleware
// covers) without an Idempotency-Key gets a fresh one, 128 random bits; a
// request that has a key keeps it. A header that is present but empty or
// blank is no key, and gets a fresh one in its place: sent as it is, a
// server that reads it as absent would run every attempt unguarded. An
// empty value beside the key is dropped: the server would read two keys,
// and refuse the request. The transport sends the request, and
// sends it again with the same key, the same headers and the same body
// while the answer is one that another attempt may improve:
//
//   - no answer at all: a refused connection, a reset, a connection closed
//     after the request was sent. The server may have run the request; the
//     key is what makes sending it again safe, since a server that honours
//     it runs a key once and replays its answer;
//   - 409 with the problem code PROCESSING: the first attempt still runs;
//   - 429 Too Many Requests, 502, 503 (idemhttp's STORE_UNAVAILABLE among
//     them) and 504.
//
// It waits for Retry-After when the answer has one (seconds or an HTTP
// date), else an exponential backoff with full jitter; it stops at
// MaxAttempts (5), before a wait that would pass the request context's
// deadline (http.Client.Timeout sets one too), or when Retry-After asks for
// more than MaxRetryAfter, and then returns the last answer as it came.
//
// # What it does not retry
//
//   - Methods it does not cover, unless listed in RetryMethods (which
//     retries them without adding a key): a GET, PUT or DELETE is sent
//     once and its answer returned, untouched. PUT and DELETE are
//     idempotent by HTTP's definition, but whether a server keeps that
//     promise is the caller's knowledge, not the transport's.
//   - Any other answer, including 500 (a server error is not a reason to
//     expect a better answer), 422 KEY_MISMATCH and a 409 with another code
//     (a business conflict is the server's final word).
//   - An answer marked Idempotent-Replayed: true, whatever its status: it
//     is the key's stored answer, and every retry would get it again.
//   - A request whose body cannot be sent twice: a body with GetBody
//     (http.NewRequest sets it for bytes and strings readers) is rewound
//     between attempts; any other body is read into memory up to
//     MaxBufferedBody (1 MiB), and a larger one is sent once, not retried.
//   - TLS certificate errors, and requests whose context has ended.
//
// The caller's *http.Request is never modified: every attempt is a clone.
// The answers it retries are drained and closed before the next attempt.
//
// # Keys for downstream calls
//
// A server handling a keyed request that itself calls a keyed API (a
// payment provider) should not use this transport's random keys for that
// call: a retry of its own request would then make the downstream call
// under a new key. Derive the key from the request's lease instead,
// idemhttp.ExecutionFrom(ctx).Lease().DeriveKey("charge"), and set it on
// the downstream request; the transport keeps a key it finds.
//
// Package idemclient imports the standard library, idem and idemhttp only.
package idemclient
