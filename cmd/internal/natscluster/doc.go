// Package natscluster holds the tests of the natsjs adapter through a
// three-node NATS JetStream cluster that loses a node: three nats-server
// processes with cluster routes on loopback ports, a stream of three
// replicas, an outbox relay publishing committed events and an inbox
// consumer writing effect rows while the stream's leader, or a follower,
// is killed (SIGKILL) and started again; and the limit of the server's
// own guarantee (a memory stream of one replica forgets what it acked).
// The package has no code of its own; see its tests.
package natscluster
