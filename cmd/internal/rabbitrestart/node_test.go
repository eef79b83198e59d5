package rabbitrestart

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/cmd/internal/outboxload"
	"github.com/idemkit/idem/internal/testenv"
)

// binaryVar names the rabbitmq-server script the tests run. The default
// is Debian's own script, which runs the node as the calling user
// (/usr/sbin/rabbitmq-server switches to the rabbitmq user, who cannot
// write the test's directories), then rabbitmq-server on PATH.
const binaryVar = "IDEM_RABBITMQ_SERVER"

// startTimeout bounds a node's boot, cold or on its data after a kill.
const startTimeout = 90 * time.Second

// A node is a RabbitMQ node of the test's own, next to the machine's:
// its own node name, AMQP and distribution ports on loopback, and its
// data, logs, configuration and Erlang cookie in t.TempDir(). It shares
// the machine's epmd.
type node struct {
	*outboxload.Server
	url  string
	name string // its cluster_name
}

func startNode(t *testing.T) *node {
	t.Helper()
	bin := outboxload.Binary(binaryVar, "/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server")
	if bin == "" {
		testenv.Unavailable(t, "rabbitmq-server", binaryVar, fmt.Errorf("no rabbitmq-server script"))
	}
	dir := t.TempDir()
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ports := outboxload.FreePorts(t, 2)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "idem-" + hex.EncodeToString(b)
	files := map[string]string{
		// cluster_name, announced to each AMQP client, tells this node
		// from any other on the port.
		"rabbitmq.conf":   fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\ncluster_name = %s\n", ports[0], name),
		"enabled_plugins": "[].\n",
		// Read instead of the machine's rabbitmq-env.conf, whose
		// NODENAME is the machine's node.
		"rabbitmq-env.conf": "",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	n := &node{
		Server: &outboxload.Server{
			Name: "rabbitmq", Args: []string{bin}, Log: filepath.Join(dir, "server.log"), Addr: addr,
			Env: []string{
				"HOME=" + filepath.Join(dir, "home"), // the Erlang cookie
				"RABBITMQ_NODENAME=" + name + "@localhost",
				fmt.Sprint("RABBITMQ_NODE_PORT=", ports[0]),
				fmt.Sprint("RABBITMQ_DIST_PORT=", ports[1]),
				"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
				"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
				"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
				"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
				"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
				"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(dir, "rabbitmq-env.conf"),
				"ERL_EPMD_ADDRESS=127.0.0.1",
				"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
			},
		},
		url:  "amqp://guest:guest@" + addr + "/",
		name: name,
	}
	n.Start(t, startTimeout)
	n.waitAMQP(t)
	return n
}

// restart starts the killed node again on its data.
func (n *node) restart(t *testing.T) {
	t.Helper()
	n.Start(t, startTimeout)
	n.waitAMQP(t)
}

// waitAMQP waits until the node takes an AMQP connection (its port
// opens before it has finished booting), and checks that the node that
// answers is this one.
func (n *node) waitAMQP(t *testing.T) {
	t.Helper()
	var c *amqp.Connection
	outboxload.Eventually(t, startTimeout, "an AMQP connection to the test's node", func() bool {
		var err error
		c, err = amqp.Dial(n.url)
		return err == nil
	})
	defer c.Close()
	if got := c.Properties["cluster_name"]; got != n.name {
		t.Fatalf("the node on %s is %v, not the test's %s", n.Addr, got, n.name)
	}
}

// channel returns a channel on a connection closed when the test ends
// (or by the node's death).
func (n *node) channel(t *testing.T) *amqp.Channel {
	t.Helper()
	c, err := amqp.Dial(n.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// depth returns the ready messages of queue, and whether the node has
// it, on a connection of its own (a passive declare of a missing queue
// closes its channel).
func (n *node) depth(t *testing.T, queue string, durable bool, args amqp.Table) (messages int, found bool) {
	t.Helper()
	c, err := amqp.Dial(n.url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, durable, false, false, false, args)
	var amqpErr *amqp.Error
	switch {
	case err == nil:
		return q.Messages, true
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
		return 0, false
	}
	t.Fatalf("inspect %s: %v", queue, err)
	return 0, false
}

// info describes queue as the node sees it (ready messages and
// consumers), or why it could not be inspected, for a test's failure.
func (n *node) info(t *testing.T, queue string, args amqp.Table) string {
	t.Helper()
	c, err := amqp.DialConfig(n.url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return fmt.Sprint("dial: ", err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return fmt.Sprint("channel: ", err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, args)
	if err != nil {
		return fmt.Sprint("inspect: ", err)
	}
	return fmt.Sprintf("%d ready, %d consumers", q.Messages, q.Consumers)
}
