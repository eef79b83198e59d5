// Package natsjsembed holds tests of the natsjs adapter on a NATS server
// of the version cmd embeds (shopd's), started in the test process: the
// behaviour that depends on the server's version (TermWithReason from
// 2.10.4) cannot be observed on an older server. The package has no code
// of its own; see its tests.
package natsjsembed
