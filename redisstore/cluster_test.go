package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redisproc"
	"github.com/idemkit/idem/internal/testenv"
)

// cluster is the 3-master Redis Cluster the package's tests start, once,
// on spare loopback ports; TestMain stops it.
var cluster struct {
	once    sync.Once
	addrs   []string
	missing error // redis-server or redis-cli is not on PATH
	err     error // the cluster did not start
	procs   []*exec.Cmd
	dir     string
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopCluster()
	os.Exit(code)
}

// clusterClient returns a client of the test cluster, starting it first if
// needed. Without redis-server and redis-cli on PATH it skips t (fails it
// under IDEM_REQUIRE_SERVICES=1).
func clusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cluster.once.Do(startCluster)
	if cluster.missing != nil {
		testenv.Unavailable(t, "redis-server (cluster)", "PATH", cluster.missing)
	}
	if cluster.err != nil {
		t.Fatalf("starting a Redis Cluster: %v", cluster.err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.addrs, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func startCluster() {
	server, err := exec.LookPath("redis-server")
	if err == nil {
		_, err = exec.LookPath("redis-cli")
	}
	if err != nil {
		cluster.missing = err
		return
	}
	// A node may fail to start on its port (FreePort's port, free a
	// moment before, taken by another process since): a node refused its
	// connections for the whole start on a loaded CI machine. Each try
	// takes new ports; the last one's error stands, with its logs kept.
	for try := 1; ; try++ {
		if cluster.err = launchCluster(server); cluster.err == nil || try == 3 {
			return
		}
		stopCluster()
		cluster.procs, cluster.addrs, cluster.dir = nil, nil, ""
	}
}

func launchCluster(server string) error {
	dir, err := os.MkdirTemp("", "redisstore-cluster-")
	if err != nil {
		return err
	}
	cluster.dir = dir
	for range 3 {
		port, err := redisproc.FreePort()
		if err != nil {
			return err
		}
		bus, err := redisproc.FreePort()
		if err != nil {
			return err
		}
		p := strconv.Itoa(port)
		log, err := os.Create(filepath.Join(dir, "redis-"+p+".log"))
		if err != nil {
			return err
		}
		cmd := exec.Command(server,
			"--port", p, "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+p+".conf",
			"--cluster-port", strconv.Itoa(bus),
			"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no")
		cmd.Stdout, cmd.Stderr = log, log
		setDeathSignal(cmd)
		if err := cmd.Start(); err != nil {
			return err
		}
		cluster.procs = append(cluster.procs, cmd)
		cluster.addrs = append(cluster.addrs, "127.0.0.1:"+p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, addr := range cluster.addrs {
		if err := waitFor(ctx, addr, func(c *redis.Client) error { return c.Ping(ctx).Err() }); err != nil {
			return fmt.Errorf("node %s: %w (logs in %s)", addr, err, dir)
		}
	}
	args := append([]string{"--cluster", "create"}, cluster.addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	for _, addr := range cluster.addrs {
		err := waitFor(ctx, addr, func(c *redis.Client) error {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
				return errors.New("cluster state not ok yet")
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", addr, err)
		}
	}
	return nil
}

// waitFor retries check on a client of addr until it succeeds or ctx ends.
func waitFor(ctx context.Context, addr string, check func(*redis.Client) error) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for {
		err := check(c)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func stopCluster() {
	for _, cmd := range cluster.procs {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	if cluster.dir != "" {
		_ = os.RemoveAll(cluster.dir)
	}
}
