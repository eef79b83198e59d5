package natscluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/cmd/internal/outboxload"
	"github.com/idemkit/idem/internal/testenv"
)

// binaryVar names the nats-server binary the tests run (default: the
// one on PATH, or Debian's).
const binaryVar = "IDEM_NATS_SERVER"

// startTimeout bounds a node's start and a stream's election.
const startTimeout = 60 * time.Second

// A cluster is three nats-server processes with JetStream, routed to
// each other on loopback ports, each with its store in t.TempDir().
type cluster struct {
	nodes []*outboxload.Server
	urls  []string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	bin := outboxload.Binary(binaryVar, "nats-server", "/usr/sbin/nats-server")
	if bin == "" {
		testenv.Unavailable(t, "nats-server", binaryVar, fmt.Errorf("no nats-server binary"))
	}
	const n = 3
	ports := outboxload.FreePorts(t, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
	}
	// Names of this cluster's own: a node that answered on a port of
	// another test's cluster would not route to this one's.
	id := fmt.Sprint(time.Now().UnixNano())
	c := &cluster{}
	for i := range n {
		dir := t.TempDir()
		conf := filepath.Join(dir, "nats.conf")
		text := fmt.Sprintf(`server_name: n%d
listen: 127.0.0.1:%d
jetstream { store_dir: %q }
cluster {
  name: idem%s
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, i, ports[i], filepath.Join(dir, "js"), id, ports[n+i], strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", ports[i])
		c.nodes = append(c.nodes, &outboxload.Server{
			Name: fmt.Sprintf("n%d", i), Args: []string{bin, "-c", conf}, Log: filepath.Join(dir, "nats.log"), Addr: addr,
		})
		c.urls = append(c.urls, "nats://"+addr)
	}
	for _, s := range c.nodes {
		s.Start(t, startTimeout)
	}
	return c
}

// node returns the node named name (a server_name).
func (c *cluster) node(t *testing.T, name string) *outboxload.Server {
	t.Helper()
	for _, s := range c.nodes {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no node %q", name)
	return nil
}

// connect returns a JetStream client that knows every node and
// reconnects forever.
func (c *cluster) connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(strings.Join(c.urls, ","),
		nats.Name(t.Name()), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		// The client's default prints each connection the kills reset.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// createStream creates sc, retrying while the cluster elects its
// meta leader, and waits until every replica is current.
func createStream(t *testing.T, js jetstream.JetStream, sc jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	var s jetstream.Stream
	outboxload.Eventually(t, startTimeout, "the stream "+sc.Name+" created", func() bool {
		var err error
		s, err = js.CreateStream(context.Background(), sc)
		return err == nil
	})
	waitCurrent(t, s)
	return s
}

// waitCurrent waits until the stream has a leader and every replica
// is current and online.
func waitCurrent(t *testing.T, s jetstream.Stream) *jetstream.ClusterInfo {
	t.Helper()
	var ci *jetstream.ClusterInfo
	outboxload.Eventually(t, startTimeout, "the stream's replicas current", func() bool {
		ci = clusterInfo(t, s)
		return current(ci)
	})
	return ci
}

// consumerCurrent waits until the consumer has a leader and every
// replica is current and online.
func consumerCurrent(t *testing.T, c jetstream.Consumer) *jetstream.ClusterInfo {
	t.Helper()
	var ci *jetstream.ClusterInfo
	outboxload.Eventually(t, startTimeout, "the consumer's replicas current", func() bool {
		ci = consumerInfo(t, c)
		return current(ci)
	})
	return ci
}

// consumerInfo returns the consumer's cluster info; nil while it cannot
// be had.
func consumerInfo(t *testing.T, c jetstream.Consumer) *jetstream.ClusterInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		return nil
	}
	return info.Cluster
}

// current reports whether ci has a leader and every replica is current
// and online.
func current(ci *jetstream.ClusterInfo) bool {
	if ci == nil || ci.Leader == "" {
		return false
	}
	for _, r := range ci.Replicas {
		if !r.Current || r.Offline {
			return false
		}
	}
	return true
}

// clusterInfo returns the stream's cluster info; nil while it cannot be had.
func clusterInfo(t *testing.T, s jetstream.Stream) *jetstream.ClusterInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		return nil
	}
	return info.Cluster
}

// copies returns the stream's messages by Nats-Msg-Id: how many copies
// of each it holds. A request that fails while the cluster settles
// after a restart is tried again.
func copies(t *testing.T, s jetstream.Stream) map[string]int {
	t.Helper()
	ctx := context.Background()
	var info *jetstream.StreamInfo
	retry(t, "the stream's info", func() (err error) { info, err = s.Info(ctx); return err })
	out := map[string]int{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		var m *jetstream.RawStreamMsg
		retry(t, fmt.Sprint("message ", seq), func() (err error) { m, err = s.GetMsg(ctx, seq); return err })
		out[m.Header.Get(nats.MsgIdHdr)]++
	}
	return out
}

// retry calls f until it succeeds, for up to 30 s.
func retry(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
