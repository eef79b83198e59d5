package outboxload

import (
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A Server is a server process a test starts, kills and starts again:
// its command, environment and log file. Each start runs it in a process
// group of its own, so that Kill reaches the processes it spawned.
type Server struct {
	Name string
	Args []string // the command and its arguments
	Env  []string // added to the test's environment
	Log  string   // stdout and stderr of every start, appended
	Addr string   // host:port that answers once it is up

	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the server and waits (up to timeout) until Addr accepts
// connections; it fails t, with the log's tail, if it exits first. The
// server is killed when the test ends.
func (s *Server) Start(t testing.TB, timeout time.Duration) {
	t.Helper()
	if s.cmd != nil {
		t.Fatalf("%s started twice", s.Name)
	}
	log, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(s.Args[0], s.Args[1:]...)
	cmd.Env = append(os.Environ(), s.Env...)
	cmd.Dir = filepath.Dir(s.Log)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", s.Name, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	done := s.done
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { s.Kill(t) })
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("%s exited before it listened on %s; its log ends:\n%s", s.Name, s.Addr, s.Tail(t))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening on %s after %v; its log ends:\n%s", s.Name, s.Addr, timeout, s.Tail(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Kill sends SIGKILL to the server's process group and waits for the
// server to exit. It does nothing if the server is not running.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Errorf("%s (pid %d) still running 30 s after SIGKILL", s.Name, s.cmd.Process.Pid)
	}
	s.cmd = nil
}

// Tail returns the last lines of the server's log.
func (s *Server) Tail(t testing.TB) string {
	b, err := os.ReadFile(s.Log)
	if err != nil {
		return fmt.Sprint(err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// FreePorts returns n distinct TCP ports free on 127.0.0.1, chosen at
// random below the kernel's ephemeral range (32768 and up on Linux): a
// port the kernel hands out — to a client's connection, or to another
// test's listener on port 0 — would be taken while a killed server is
// down, or by another test between this check and the server's bind.
// The ports are held until all were found, then released.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range 1000 {
		if len(ports) == n {
			return ports
		}
		p := 20000 + mathrand.IntN(12000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken
		}
		defer l.Close()
		ports = append(ports, p)
	}
	t.Fatalf("found %d free ports of %d", len(ports), n)
	return nil
}

// Binary returns the path of a server's binary: envVar's value, or the
// first of names found on PATH or as a path; "" if none is.
func Binary(envVar string, names ...string) string {
	if v := os.Getenv(envVar); v != "" {
		return v
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}
