// Package httpharness is the harness of the idemhttp middleware's tests,
// shared by idemhttp's own tests and by the tests of the stores that run
// the middleware over themselves (sqlstore on SQLite, redisstore's
// benchmarks), so that no module keeps a copy of it.
//
// It gives an Env (a middleware over a store, with a handler that counts
// its runs), requests and the problem+json check, the response that tests
// of the stored-response filter complete with, and the drivers of the
// middleware's benchmarks with their 1 KiB JSON body.
//
// It imports the standard library and the packages idem, idemhttp and
// memstore only, so the root module's tests stay free of requirements. It
// is test code: its functions fail the test (or benchmark) they are given
// instead of returning errors.
package httpharness
