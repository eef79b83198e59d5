// Package payprov is a simulated payment provider, the foreign side of the
// shop's multi-step operations in tests: it refunds payments, charges cards
// and (as a carrier would) creates shipments, each effect at most once per
// Idempotency-Key, as Stripe does, and fails on command in the ways a real
// provider fails, so that a test can kill its caller between steps and
// check that each effect happened exactly once.
//
// It serves:
//
//	POST /v1/refunds    {"payment","amount_cents","currency","reason"}   → 201 Refund   (id re_…)
//	POST /v1/charges    {"amount_cents","currency","source","description"} → 201 Charge (id ch_…)
//	POST /v1/shipments  {"order","address"}                              → 201 Shipment (id shp_…)
//
// and, for tests, a control API on the same address:
//
//	POST   /_control/faults     queue a Fault: {"path","mode","count","delay_ms"}
//	GET    /_control/faults     the queued faults, with the requests each has left
//	DELETE /_control/faults     clear them
//	POST   /_control/payments   register a Payment: {"payment","amount_cents","non_refundable"}
//	GET    /_control/refunds    the Ledger: every refund made, with its key, and every key used
//	GET    /_control/charges    the same for charges
//	GET    /_control/shipments  the same for shipments
//
// Bodies are JSON objects with known members only; a body that is not one,
// or that lacks what the resource needs (a positive amount_cents, a
// currency of three capitals), is 400 invalid_request. Every error is
// {"error":{"code","message"}}. Client calls all of it.
//
// # Idempotency
//
// Every POST to /v1 needs an Idempotency-Key header (1 to 255 bytes of
// UTF-8 without control characters, taken as is: quotes are part of the
// key; 400 idempotency_key_required without). The first request with a key
// that gets an answer makes the effect and stores its answer under the
// key, a 201 or a refusal (402); every later request with the key and an
// equal body (equal members, whatever their order or spacing) gets that
// answer again, with the header Idempotent-Replayed: true, and makes
// nothing. A key is the provider's, not an endpoint's: one used for
// another body, or another endpoint, answers 422 idempotency_key_reused.
// While a request with a key is being handled, another one with it
// answers 409 request_in_progress (Stripe's behaviour) and makes nothing.
// A malformed request (400) and a failure (500) store nothing: a retry
// with the key is a first request.
//
// # Refusals
//
// A definite refusal answers 402 with a code, and is stored under the key
// like a success, so a retry gets it again:
//
//	refund_refused    the payment was registered with non_refundable, or the
//	                  payment's refunds would total more than its amount_cents
//	                  (when registered with one) or the server's refund limit
//	                  (Config.RefundLimitCents, -refund-limit; 0: none)
//	card_declined     a charge from the source "tok_chargeDeclined"
//	shipment_refused  only by the fault refuse
//
// A payment need not be registered: an unknown payment is refundable up to
// the server's limit.
//
// # Faults
//
// A fault is taken by the next Count requests to its Path (all of them
// while it stays queued when Count is 0; every /v1 path when Path is
// empty), replays included; faults are queued in order and a request takes
// the first that matches, so "fail twice, then time out after the effect"
// is two POSTs. Malformed requests take none. The modes:
//
//	fail                  500 provider_error; nothing made, nothing stored
//	hang                  no answer, nothing made, until the client goes or the
//	                      server closes; then the connection is dropped
//	timeout_after_effect  the request is handled (the effect made, its answer
//	                      stored), then hangs as hang does: the caller cannot
//	                      tell that the effect happened, and its retry under
//	                      the key gets the stored answer
//	refuse                402 with the resource's refusal code, stored under the
//	                      key (a key with an answer stored replays it instead)
//	delay                 the answer comes delay_ms later; a new key is held in
//	                      progress meanwhile (so a concurrent request with it
//	                      gets 409), and freed with nothing made if the client goes
//
// # Guarantees
//
// An effect is made at most once per key, also under concurrent requests
// with the key, and a key's answer never changes once stored. Within one
// Server, GET /_control/{kind} lists every effect made, in order, with
// its key and the requests each key received. Nothing else is promised:
// there is no authentication, and the provider never calls back (no
// webhooks).
//
// State lives in memory, so a provider process that dies forgets it,
// unless Config.StatePath (-state) names a file: then every answer stored
// and every payment registered is written to it before the answer is sent (a new file renamed over the
// old; a failure to write is logged), and a new process on the file keeps the effects, the answers and
// the payments; a key that was in progress when the process died is free
// again, its effect not made. Faults live in memory only.
//
// Main runs it as a process (cmd/payprov), printing
// "payprov listening on http://HOST:PORT" first.
package payprov
