// Package rabbitrestart holds the tests of the rabbitmq adapter through
// a RabbitMQ node restarted under load: a node of the test's own (a
// second rabbitmq-server next to the machine's, on free loopback ports,
// its data in t.TempDir()), an outbox relay publishing committed events
// under confirms into a durable classic queue and a quorum queue, and
// inbox consumers writing effect rows, while the node is killed
// (SIGKILL) and started again on the same data; and the limit of the
// broker's own guarantee (a transient queue loses what it confirmed).
// The package has no code of its own; see its tests.
package rabbitrestart
