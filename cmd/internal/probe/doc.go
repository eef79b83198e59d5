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
// with another payload, no double execution under concurrency nor for
// another body in flight, 400 for a malformed key) and what no API may
// get wrong whoever wrote it (one caller's answer or cookie never handed
// to another, a GET never served from a POST's record); Report.CoreOK
// says whether they held. A profile's checks are a house style the draft
// allows an API not to follow: "stripe" (the Idempotent-Replayed: true
// marker, 409 to concurrent duplicates, a fingerprint insensitive to JSON
// member order), "strict-keys" (a bare key names the key its quoted form
// does, empty and non-UTF-8 keys refused), "retry-safe" (a 5xx is not
// kept, a 409 carries Retry-After) and "problem-details" (refusals are
// RFC 9457 problem details). Every profile runs and is reported
// (Report.Profiles); only the profiles Config.Profiles requires make
// Report.OK false. A replay is recognised by its answer, the first answer
// byte for byte: a marker is reported under any of ReplayedHeaders and
// required only by stripe. A warning is an answer the draft allows that
// weakens the protection (a lenient key validation, a key space shared
// between callers): it fails no grade.
//
// Some checks need the caller to say more about the API, and are not
// applicable without it: Config.KeyRequired (a keyless request must be
// refused), Config.OtherHeader (a second caller: scoped-keys),
// Config.RefusedBody and Config.ServerErrorBody (a 4xx kept, a 5xx let
// go), Config.Retention (the expiry check, which makes the run last that
// long).
//
// Answers alone cannot always tell an execution from a replay: an API that
// answers every request with the same bytes looks idempotent whether it
// ran once or ten times. Config.EffectURL and Config.EffectPath name a
// count the API's effect moves (the number of orders of the caller, say);
// the probe then reads it before and after every check and asserts it
// moved by the executions the answers show: a 2xx answer is one unless it
// repeats, byte for byte, an earlier answer under its key or is marked a
// replay (answers with ids of their own under one key are as many
// executions). The second caller's executions may move it or not (a count
// of every caller's effects, or of the first caller's). The count is read
// once more a second after the last check (Config.EffectSettle), so that
// an execution that lands after its answer is counted; it must otherwise
// move with the answers (a read model that lags its writes fails the
// checks it lags behind). Without them the probe judges answers only, and
// says so.
//
// Every key is fresh: a version 4 UUID whose first group is a run id of
// 32 random bits (36 bytes, the form most APIs take), so runs never meet
// each other's records. Each check runs after the previous one ended, so
// that the effect it moved is its own; the count must not be moved by
// anyone else while the probe runs (give the probe a user or tenant of its
// own).
//
// What the probe does not check: anything that needs the server's
// co-operation (a lost response, a crash between effect and record, a
// request held in flight on purpose: whether a duplicate arrives while
// the first runs is the network's and the server's timing, so 409 checks
// are judged only on the 409s that came).
package probe
