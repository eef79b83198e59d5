// Package probe checks an HTTP API's Idempotency-Key semantics from the
// outside: it sends requests as a retrying client would (concurrent
// duplicates, sequential retries, a reused key with another body, keys
// missing, malformed, overlong, quoted or spelled in another case) and
// reports, check by check (pass, fail, warning or n/a, with the answers
// as evidence), whether the API answered as
// draft-ietf-httpapi-idempotency-key-header-07 says it must. Run takes a
// Config and returns a Report; it prints nothing (idem probe, in package
// idemcli, is its command line).
//
// Checks have two grades. Core checks are the draft's MUST and SHOULD
// (one execution per key, the first answer replayed, 422 for a reused key
// with another payload, no double execution under concurrency, 400 for a
// malformed key); Report.CoreOK says whether they held. A profile's checks
// are a house style the draft allows an API not to follow: "stripe" (the
// Idempotent-Replayed: true marker, 409 to concurrent duplicates, a
// fingerprint insensitive to JSON member order) and "strict-keys" (a bare
// key names the key its quoted form does, empty and non-UTF-8 keys
// refused). Every profile runs and is reported (Report.Profiles); only the
// profiles Config.Profiles requires make Report.OK false. A replay is
// recognised by its answer, the first answer byte for byte: a marker is
// reported under any of ReplayedHeaders and required only by stripe. A
// warning is an answer the draft allows that weakens the protection (a
// lenient key validation): it fails no grade.
//
// Answers alone cannot always tell an execution from a replay: an API that
// answers every request with the same bytes looks idempotent whether it
// ran once or ten times. Config.EffectURL and Config.EffectPath name a
// count the API's effect moves (the number of orders of the caller, say);
// the probe then reads it before and after every check and asserts it
// moved by the executions the answers show: a 2xx answer is one unless it
// repeats, byte for byte, an earlier answer under its key or is marked a
// replay (answers with ids of their own under one key are as many
// executions). Without them the probe judges answers only, and says so.
//
// Every key is fresh: "probe-", a run id of 32 random bits, "-" and 128
// random bits in hex (47 bytes, valid for idemhttp and for any API that
// takes keys of 64 bytes or more), so runs never meet each other's
// records. Each check runs after the previous one ended, so that the
// effect it moved is its own; the count must not be moved by anyone else
// while the probe runs (give the probe a user or tenant of its own).
//
// What the probe does not check: that records expire (it would have to
// wait out the retention), that scopes separate callers (it has one
// identity), and anything that needs the server's co-operation (a lost
// response, a crash between effect and record).
package probe
