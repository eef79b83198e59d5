// Package redisproc starts redis-server processes of a test's own: a
// server, a replica or a Sentinel on a spare loopback port, with its
// files in a directory of the test's, killed when the test ends (and,
// on Linux, when the test binary dies). Tests that change a server's
// configuration, kill it or fail it over use it, never the shared
// server. It imports the standard library only.
package redisproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
)

// StartTimeout bounds how long Start and Restart wait for the server to
// answer PING.
const StartTimeout = 30 * time.Second

// A Server is one redis-server process of a test.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int
	Dir  string // its working directory, and where its log is

	bin  string
	conf string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// Options says how to start a server.
type Options struct {
	// Conf, when set, is written to redis.conf in the server's directory
	// and given as its first argument (a Sentinel needs a file it can
	// rewrite).
	Conf string
	// Args are added to the command line (after "--port N --bind
	// 127.0.0.1 --dir DIR" and, without Conf, "--save '' --appendonly
	// no").
	Args []string
}

// Start starts redis-server with opts on a free loopback port, in a new
// directory under t.TempDir(), and waits until it answers PING. It is
// killed when t ends. Without redis-server on PATH it skips t (fails it
// under IDEM_REQUIRE_SERVICES=1).
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "redis-server", "PATH", err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: t.TempDir(), bin: bin}
	s.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", s.Dir}
	if opts.Conf != "" {
		s.conf = filepath.Join(s.Dir, "redis.conf")
		if err := os.WriteFile(s.conf, []byte(opts.Conf), 0o600); err != nil {
			t.Fatal(err)
		}
	} else {
		s.args = append(s.args, "--save", "", "--appendonly", "no")
	}
	s.args = append(s.args, opts.Args...)
	t.Cleanup(s.Kill)
	if err := s.start(nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// Restart starts the server again, on its port and with its directory
// and arguments, plus extra; it fails t if the server does not answer.
func (s *Server) Restart(t testing.TB, extra ...string) {
	t.Helper()
	if err := s.start(extra); err != nil {
		t.Fatal(err)
	}
}

func (s *Server) start(extra []string) error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(append(args, s.args...), extra...)
	log, err := os.OpenFile(filepath.Join(s.Dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	s.mu.Lock()
	s.cmd, s.log = cmd, log
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if err := waitPing(ctx, s.Addr); err != nil {
		out, _ := os.ReadFile(log.Name())
		return fmt.Errorf("redis-server %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to exit. Killing a server that is not running does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, log := s.cmd, s.log
	s.cmd, s.log = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	_ = log.Close()
}

// Log returns what the server has logged so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}

// waitPing sends PING to addr until it answers +PONG or ctx ends.
func waitPing(ctx context.Context, addr string) error {
	var last error
	for {
		if last = ping(addr); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return errors.New(strings.TrimSpace(line))
	}
	return nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
