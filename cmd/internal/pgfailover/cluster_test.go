//go:build linux

package pgfailover

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/idem/internal/testenv"
)

// binVar names a directory holding initdb, postgres and pg_basebackup.
const binVar = "IDEM_PG_BIN"

// debianBin is where Debian's postgresql-15 package puts the server
// programs, which are not on PATH there.
const debianBin = "/usr/lib/postgresql/15/bin"

// serverWait bounds every wait for a server: to start, to stream, to be
// promoted. Generous: the machine may be loaded.
const serverWait = 90 * time.Second

// programs are the PostgreSQL programs the tests run, and the OS user
// they run as.
type programs struct {
	initdb, postgres, basebackup string
	cred                         *syscall.Credential // nil: the test's own user
}

// findPrograms finds the server programs, or skips t (fails it under
// IDEM_REQUIRE_SERVICES=1) naming IDEM_PG_BIN.
func findPrograms(t *testing.T) programs {
	t.Helper()
	var dirs []string
	if d := os.Getenv(binVar); d != "" {
		dirs = append(dirs, d)
	}
	dirs = append(dirs, debianBin)
	find := func(name string) (string, error) {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
		return exec.LookPath(name)
	}
	var p programs
	for name, dst := range map[string]*string{"initdb": &p.initdb, "postgres": &p.postgres, "pg_basebackup": &p.basebackup} {
		path, err := find(name)
		if err != nil {
			testenv.Unavailable(t, "PostgreSQL server programs", binVar, err)
		}
		*dst = path
	}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Unavailable(t, "the postgres OS user, to run PostgreSQL as (it refuses root)", binVar, err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("postgres user: %v", err)
		}
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	return p
}

// cluster is two server slots on loopback ports of their own. One slot
// runs the primary; the other runs its replica, or nothing after a kill.
// A slot's port stays the same across the servers it runs, so the
// program's multi-host URL names both slots for the whole test.
type cluster struct {
	t     *testing.T
	prog  programs
	base  string // the servers' directories and logs
	ports [2]int
	gen   int // incarnations so far, for names
	nodes []*node
}

// node is one server process and its data directory.
type node struct {
	c      *cluster
	name   string // cluster_name, the replica's application_name
	slot   int
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
	admin  *sql.DB
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	prog := findPrograms(t)
	base := t.TempDir()
	if prog.cred != nil {
		// The servers' user must reach and own base; t.TempDir's own
		// parent is private to the test's user.
		if err := os.Chmod(filepath.Dir(base), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(base, int(prog.cred.Uid), int(prog.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	c := &cluster{t: t, prog: prog, base: base}
	for i := range c.ports {
		c.ports[i] = freePort(t)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.kill()
		}
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("server %s's log ends:\n%s", n.name, tail(n.log, 3000))
			}
		}
	})
	return c
}

// freePort returns a loopback port nothing listens on, below Linux's
// default ephemeral range (32768 up): a slot's port is free for seconds
// between a kill and the server rebuilt on it, and there no outgoing
// connection of the machine's may take it meanwhile.
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatal("no free loopback port in 20000-31999")
	return 0
}

// url is the program's URL: both slots, and pgx keeps the one that
// accepts writes.
func (c *cluster) url() string {
	return multiHost(fmt.Sprintf("127.0.0.1:%d", c.ports[0]), fmt.Sprintf("127.0.0.1:%d", c.ports[1]))
}

// multiHost is a pgx URL naming every server a program may reach, of
// which pgx uses the first that accepts writes: what a program that
// follows a failover without a proxy or a virtual IP is given.
func multiHost(addrs ...string) string {
	return "postgres://postgres@" + strings.Join(addrs, ",") + "/postgres?sslmode=disable&connect_timeout=5&target_session_attrs=read-write"
}

// syncPair starts a primary in slot 0 and its synchronous replica in
// slot 1.
func syncPair(t *testing.T) (c *cluster, primary, replica *node) {
	t.Helper()
	c = newCluster(t)
	primary = c.initPrimary(0)
	replica = c.startReplica(1, primary.addr())
	c.attachSync(primary, replica)
	return c, primary, replica
}

// run runs a program as the servers' user and fails t with its output
// when it fails.
func (c *cluster) run(name string, args ...string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), serverWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.prog.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}

// newNode names the next incarnation of slot.
func (c *cluster) newNode(slot int) *node {
	name := fmt.Sprintf("%c%d", 'a'+slot, c.gen)
	c.gen++
	return &node{c: c, name: name, slot: slot, dir: filepath.Join(c.base, name), log: filepath.Join(c.base, name+".log")}
}

// initPrimary makes a new database in slot and starts it.
func (c *cluster) initPrimary(slot int) *node {
	c.t.Helper()
	n := c.newNode(slot)
	c.run(c.prog.initdb, "-D", n.dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	n.start()
	return n
}

// startReplica copies the primary reached at upstream (host:port: the
// primary, or a proxy in front of it) with pg_basebackup -R into a new
// directory of slot and starts it as a streaming replica.
func (c *cluster) startReplica(slot int, upstream string) *node {
	c.t.Helper()
	n := c.newNode(slot)
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		c.t.Fatal(err)
	}
	c.run(c.prog.basebackup, "-d", fmt.Sprintf("host=%s port=%s user=postgres", host, port),
		"-D", n.dir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	// The copy has the primary's postgresql.auto.conf, which may name this
	// very server as its synchronous standby: once promoted, it would wait
	// for itself. Start with none; attachSync names one when there is.
	f, err := os.OpenFile(filepath.Join(n.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	_, err = f.WriteString("synchronous_standby_names = ''\n")
	if err := errors.Join(err, f.Close()); err != nil {
		c.t.Fatal(err)
	}
	n.start()
	return n
}

// start runs the server and waits until it answers.
func (n *node) start() {
	t := n.c.t
	t.Helper()
	logf, err := os.Create(n.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close() // the server has its own descriptor
	n.cmd = exec.Command(n.c.prog.postgres,
		"-D", n.dir,
		"-p", strconv.Itoa(n.c.ports[n.slot]),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "cluster_name="+n.name,
		// The tests kill processes, not the machine: what a server wrote
		// is in the kernel's cache and survives its death, so fsync would
		// only slow a shared machine down. synchronous_commit = on still
		// waits for the replica to write (flush) the commit's WAL.
		"-c", "fsync=off",
		"-c", "synchronous_commit=on",
		"-c", "shared_buffers=32MB",
		"-c", "max_connections=100",
		"-c", "log_min_messages=warning",
	)
	n.cmd.Dir = n.c.base
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.c.prog.cred, Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", n.name, err)
	}
	n.exited = make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	n.c.nodes = append(n.c.nodes, n)
	n.admin, err = sql.Open("pgx", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", n.c.ports[n.slot]))
	if err != nil {
		t.Fatal(err)
	}
	n.admin.SetMaxOpenConns(2)
	n.waitFor(fmt.Sprintf("server %s to accept connections", n.name), func(ctx context.Context) (bool, error) {
		return n.admin.PingContext(ctx) == nil, nil
	})
}

// addr is the server's host:port.
func (n *node) addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.c.ports[n.slot]))
}

// waitFor polls cond until it reports true, failing t after serverWait or
// when the server has exited.
func (n *node) waitFor(what string, cond func(context.Context) (bool, error)) {
	t := n.c.t
	t.Helper()
	deadline := time.Now().Add(serverWait)
	var last error
	for {
		select {
		case <-n.exited:
			t.Fatalf("waiting for %s: server %s exited; its log ends:\n%s", what, n.name, tail(n.log, 3000))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := cond(ctx)
		cancel()
		if ok && err == nil {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v (last error: %v); server %s's log ends:\n%s", what, serverWait, last, n.name, tail(n.log, 3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exec runs statements on the server, failing t on an error.
func (n *node) exec(query string, args ...any) {
	n.c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), serverWait)
	defer cancel()
	if _, err := n.admin.ExecContext(ctx, query, args...); err != nil {
		n.c.t.Fatalf("server %s: %s: %v", n.name, query, err)
	}
}

// kill kills the server as a machine's death would: every process of it
// at once (PostgreSQL's children are not in the postmaster's process
// group), the postmaster first stopped so that it starts no new one.
func (n *node) kill() {
	select {
	case <-n.exited:
		return
	default:
	}
	pid := n.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	kids := children(pid)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGSTOP)
	}
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-n.exited
	n.admin.Close()
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, child)
		}
	}
	return kids
}

// promote ends the replica's recovery: it becomes a primary.
func (n *node) promote() {
	n.c.t.Helper()
	n.exec(`SELECT pg_promote(true, 60)`)
	n.waitFor(fmt.Sprintf("server %s to leave recovery", n.name), func(ctx context.Context) (bool, error) {
		var recovering bool
		err := n.admin.QueryRowContext(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering)
		return !recovering, err
	})
}

// waitStreaming waits until primary streams to replica.
func (c *cluster) waitStreaming(primary, replica *node) {
	c.t.Helper()
	primary.waitFor(fmt.Sprintf("replica %s to stream from %s", replica.name, primary.name), func(ctx context.Context) (bool, error) {
		var state string
		err := primary.admin.QueryRowContext(ctx, `SELECT state FROM pg_stat_replication WHERE application_name = $1`, replica.name).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return state == "streaming", err
	})
}

// attachSync makes replica the primary's synchronous standby: from then
// on a commit returns once the replica has written its WAL.
func (c *cluster) attachSync(primary, replica *node) {
	c.t.Helper()
	c.waitStreaming(primary, replica)
	primary.exec(fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '%s'`, replica.name))
	primary.exec(`SELECT pg_reload_conf()`)
	primary.waitFor(fmt.Sprintf("replica %s to be synchronous", replica.name), func(ctx context.Context) (bool, error) {
		var state string
		err := primary.admin.QueryRowContext(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, replica.name).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return state == "sync", err
	})
}

// tail returns the last n bytes of a file, for a failure's message.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
