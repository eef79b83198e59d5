// Package probe checks an HTTP API's Idempotency-Key semantics from the
// outside: it sends requests as a retrying client would (concurrent
// duplicates, sequential retries, a reused key with another body, keys
// missing, malformed, overlong, quoted or spelled in another case) and
// reports, check by check, whether the API answered as
// draft-ietf-httpapi-idempotency-key-header-07 and Stripe's practice say
// it should. Run takes a Config and returns a Report; it prints nothing
// (idem probe, in package idemcli, is its command line).
//
// Answers alone cannot always tell an execution from a replay: an API that
// answers every request with the same bytes looks idempotent whether it
// ran once or ten times. Config.EffectURL and Config.EffectPath name a
// count the API's effect moves (the number of orders of the caller, say);
// the probe then reads it before and after every check and asserts it
// moved exactly once per distinct key an answer shows executed. Without
// them the probe judges answers only, and says so.
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
