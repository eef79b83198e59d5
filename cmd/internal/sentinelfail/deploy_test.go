package sentinelfail

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/redisproc"
)

// masterName is the name the Sentinels monitor the primary under.
const masterName = "idemfail"

// failoverTimeout bounds a Sentinel failover and every wait for the
// deployment to settle: generous, for a loaded 2-core machine.
const failoverTimeout = 60 * time.Second

// deployment is a primary, its replicas and three Sentinels, all of one
// test, on loopback.
type deployment struct {
	t         *testing.T
	servers   []*redisproc.Server // the first was the primary at the start
	sentinels []*redisproc.Server
	sentinel  *redis.SentinelClient
}

// deploy starts a primary, replicas replicas and three Sentinels and waits
// until the deployment has settled (see settle).
func deploy(t *testing.T, replicas int) *deployment {
	t.Helper()
	d := &deployment{t: t}
	primary := redisproc.Start(t, redisproc.Options{})
	d.servers = append(d.servers, primary)
	for range replicas {
		d.servers = append(d.servers, redisproc.Start(t, redisproc.Options{Args: replicaOf(primary.Addr)}))
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n"+
		"sentinel parallel-syncs %[1]s 2\n", masterName, primary.Port)
	for range 3 {
		d.sentinels = append(d.sentinels, redisproc.Start(t, redisproc.Options{Conf: conf, Args: []string{"--sentinel"}}))
	}
	d.sentinel = redis.NewSentinelClient(&redis.Options{Addr: d.sentinels[0].Addr})
	t.Cleanup(func() { _ = d.sentinel.Close() })
	if got := d.settle(); got != primary.Addr {
		t.Fatalf("the Sentinels settled on %s, not on the primary %s", got, primary.Addr)
	}
	return d
}

// addrs returns the Sentinels' addresses.
func (d *deployment) addrs() []string {
	var a []string
	for _, s := range d.sentinels {
		a = append(a, s.Addr)
	}
	return a
}

// master returns the primary's address as the Sentinels report it.
func (d *deployment) master(ctx context.Context) (string, error) {
	hp, err := d.sentinel.GetMasterAddrByName(ctx, masterName).Result()
	if err != nil {
		return "", err
	}
	return hp[0] + ":" + hp[1], nil
}

// server returns the server listening on addr.
func (d *deployment) server(addr string) *redisproc.Server {
	for _, s := range d.servers {
		if s.Addr == addr {
			return s
		}
	}
	d.t.Fatalf("no server at %s", addr)
	return nil
}

// failover kills the primary with SIGKILL and waits until the Sentinels
// name another; before that, between the kill and the promotion, it
// calls between (if not nil). It then restarts the killed server as a
// replica of the new primary, as an operator would, waits until the
// deployment has settled (see settle), and returns the new primary's
// address and how long the Sentinels took to promote it.
func (d *deployment) failover(between func(old string)) (string, time.Duration) {
	d.t.Helper()
	old, err := d.master(d.t.Context())
	if err != nil {
		d.t.Fatal(err)
	}
	killed := d.server(old)
	start := time.Now()
	killed.Kill()
	if between != nil {
		between(old)
	}
	var now string
	d.await("the Sentinels to promote a replica", func(ctx context.Context) error {
		now, err = d.master(ctx)
		if err == nil && now == old {
			err = fmt.Errorf("still %s", old)
		}
		return err
	})
	took := time.Since(start)
	d.await("the new primary to take writes", func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: now})
		defer c.Close()
		role, err := c.Do(ctx, "role").Slice()
		if err == nil && (len(role) == 0 || role[0] != "master") {
			err = fmt.Errorf("role %v", role)
		}
		return err
	})
	killed.Restart(d.t, replicaOf(now)...)
	settled := d.settle()
	d.t.Logf("failover: %s promoted %v after the kill, settled on %s %v after it", now, took.Round(time.Millisecond), settled, time.Since(start).Round(time.Millisecond))
	return settled, took
}

// settle waits until every Sentinel names the same primary, has no
// failover of its own in progress, and sees the other Sentinels and every
// other server as a replica of that primary with its link up, and until
// each of those replicas reports its link up; it returns the primary.
// That is usually the one the failover promoted, but on a loaded machine
// the Sentinels may find it unresponsive for down-after-milliseconds
// just after its promotion and fail over once more.
//
// The next kill must wait for it. A Sentinel that led a failover stays
// in it (reconfiguring the replicas) until each replica has its link up
// or failover-timeout has passed; if the new primary dies meanwhile,
// the other Sentinels fail it over at a higher epoch, which the leader
// learns without changing the primary it is still failing over; when
// its failover ends it switches to the primary it promoted, at that
// same epoch, and from then on ignores the others' configuration
// (not newer than its own): a permanent split. A client that asks that
// Sentinel (go-redis' failover client asks one) is sent to a replica,
// and every write fails READONLY.
func (d *deployment) settle() string {
	d.t.Helper()
	var primary string
	// One check of everything per poll: a failover that starts between
	// two checks (the Sentinels fail the new primary over again) is seen.
	d.await("the deployment to settle", func(ctx context.Context) error {
		primary = ""
		for _, s := range d.sentinels {
			if err := d.settled(ctx, s.Addr, &primary); err != nil {
				return fmt.Errorf("Sentinel %s: %w", s.Addr, err)
			}
		}
		for _, r := range d.servers {
			if r.Addr == primary {
				continue
			}
			c := redis.NewClient(&redis.Options{Addr: r.Addr})
			info, err := c.Info(ctx, "replication").Result()
			_ = c.Close()
			if err == nil && !strings.Contains(info, "master_link_status:up") {
				err = fmt.Errorf("replica %s: link not up", r.Addr)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return primary
}

// settled checks one Sentinel for settle; *primary is the primary the
// Sentinels checked before it named (empty: none yet).
func (d *deployment) settled(ctx context.Context, addr string, primary *string) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, masterName).Result()
	if err != nil {
		return err
	}
	switch named := hp[0] + ":" + hp[1]; {
	case *primary == "":
		*primary = named
	case named != *primary:
		return fmt.Errorf("it names %s, another %s", named, *primary)
	}
	m, err := c.Master(ctx, masterName).Result()
	switch {
	case err != nil:
		return err
	case m["flags"] != "master":
		return fmt.Errorf("master flags %s", m["flags"])
	case m["num-other-sentinels"] != strconv.Itoa(len(d.sentinels)-1):
		return fmt.Errorf("other Sentinels %s", m["num-other-sentinels"])
	}
	replicas, err := c.Replicas(ctx, masterName).Result()
	if err != nil {
		return err
	}
	up := 0
	for _, r := range replicas {
		if r["flags"] == "slave" && r["master-link-status"] == "ok" && r["master-host"]+":"+r["master-port"] == *primary {
			up++
		}
	}
	if up != len(d.servers)-1 {
		return fmt.Errorf("%d of %d replicas up: %v", up, len(d.servers)-1, replicas)
	}
	return nil
}

// awaitLink waits until the server at addr reports its link to its
// primary as status (up or down).
func (d *deployment) awaitLink(addr, status string) {
	d.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	d.await("the link of "+addr+" to be "+status, func(ctx context.Context) error {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && !strings.Contains(info, "master_link_status:"+status) {
			err = fmt.Errorf("link not %s", status)
		}
		return err
	})
}

// await polls check until it returns nil, failing the test after
// failoverTimeout.
func (d *deployment) await(what string, check func(ctx context.Context) error) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(d.t.Context(), failoverTimeout)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			var logs strings.Builder
			for _, s := range d.sentinels {
				fmt.Fprintf(&logs, "--- Sentinel %s\n%s", s.Addr, tail(s.Log()))
			}
			d.t.Fatalf("waiting for %s: %v (last: %v)\n%s", what, ctx.Err(), err, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func replicaOf(addr string) []string {
	host, port, _ := strings.Cut(addr, ":")
	return []string{"--replicaof", host, port}
}

// tail returns the last lines of a log.
func tail(s string) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// quiet discards go-redis' own log lines (a dial refused during the
// failover, the new primary found): the tests report what matters.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }
