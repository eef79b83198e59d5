package rabbitmq_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/netfault"
	"github.com/idemkit/idem/internal/testenv"
)

// The consumer's tests (HandleTx on SQLite and PostgreSQL, cut
// connections, child processes) and the benchmarks are in
// cmd/internal/rabbitmqtest, so that this module does not require sqlstore
// and its drivers.

// broker is a test's own queue and dead-letter queue on the RabbitMQ of
// testenv, deleted when the test ends, and an admin channel.
type broker struct {
	url   string
	queue string // consumed
	dlq   string // the dead-letter queue (through the default exchange)
	ch    *amqp.Channel
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// newBroker declares a queue and a dead-letter queue of the test's own.
// args are the main queue's arguments (e.g. quorum).
func newBroker(t testing.TB, args amqp.Table) *broker {
	t.Helper()
	url := testenv.RabbitMQ.Need(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		testenv.Unavailable(t, testenv.RabbitMQ.Name, testenv.RabbitMQ.Var, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{url: url, queue: randomName("idem-test-"), ch: ch}
	b.dlq = b.queue + ".dead"
	durable := args["x-queue-type"] == "quorum"
	for _, q := range []struct {
		name string
		args amqp.Table
	}{{b.queue, args}, {b.dlq, nil}} {
		if _, err := ch.QueueDeclare(q.name, durable, false, false, false, q.args); err != nil {
			t.Fatalf("declare %s: %v", q.name, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{b.queue, b.dlq} {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = conn.Close()
	})
	return b
}

// drain returns the messages of queue (acked).
func (b *broker) drain(t testing.TB, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := b.ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

type proxy struct {
	*netfault.Proxy
	url string
}

// proxyFor starts a netfault proxy to the broker at url.
func proxyFor(t testing.TB, url string) proxy {
	t.Helper()
	u, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.New(fmt.Sprintf("%s:%d", u.Host, u.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	host, port, _ := splitHostPort(p.Addr())
	u.Host, u.Port = host, port
	return proxy{p, u.String()}
}

func splitHostPort(addr string) (string, int, error) {
	var host string
	var port int
	i := len(addr) - 1
	for i >= 0 && addr[i] != ':' {
		i--
	}
	host = addr[:i]
	_, err := fmt.Sscan(addr[i+1:], &port)
	return host, port, err
}

// eventually polls cond until it holds, or fails t after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
