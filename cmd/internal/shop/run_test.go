package shop_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// Bad flag values are refused before anything starts: no listener, no
// data directory, no database connection.
func TestRunRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-db", "shop.db"}, "-db"},
		{[]string{"-db", "sqlite:"}, "-db"},
		{[]string{"-db", "postgres://app:secretpw@db:notaport/shop"}, "-db"},
		{[]string{"-db", "mysql://app:secretpw@db:3306/"}, "-db"},
		{[]string{"-db", "mysql:app:secretpw@tcp(db:3306)"}, "-db"},
		{[]string{"-db", "sqlite:DATA/shop.db", "-data", "DATA"}, "not both"},
		{[]string{"-redis", "http://cache:6379/0"}, "-redis"},
		{[]string{"-redis", "redis://u:secretpw@cache:6379/x"}, "-redis"},
		{[]string{"-redis", ""}, "-redis"},
		{[]string{"-data", ""}, "-data"},
		{[]string{"-wait", "-1s"}, "-wait"},
		{[]string{"-read-timeout", "0"}, "-read-timeout"},
		{[]string{"-write-timeout", "-1s"}, "-write-timeout"},
		{[]string{"-idle-timeout", "0"}, "-idle-timeout"},
		{[]string{"-wait", "20s", "-write-timeout", "20s"}, "-write-timeout"},
		// The write deadline counts from a request's headers, so a body
		// that takes longer than -write-timeout to arrive, which
		// -read-timeout allows, creates an order whose answer cannot be
		// written: -write-timeout must exceed -read-timeout plus -wait.
		{[]string{"-read-timeout", "3s", "-write-timeout", "2s"}, "-write-timeout"},
		{[]string{"-read-timeout", "20s", "-wait", "45s", "-write-timeout", "1m"}, "-write-timeout"},
		{[]string{"-read-timeout", "2562047h"}, "-read-timeout"},
		{[]string{"-wait", "2562047h", "-write-timeout", "2562047h"}, "-wait"},
		{[]string{"-pay-timeout", "0"}, "-pay-timeout"},
		{[]string{"-pay-timeout", "-1m"}, "-pay-timeout"},
		{[]string{"-pay-timeout", "169h"}, "-pay-timeout"},
		{[]string{"-broker", "http://mq:4222"}, "-broker"},
		{[]string{"-broker", "amqp://u:secretpw@"}, "-broker"},
		{[]string{"-broker", "nats:mq:4222"}, "-broker"},
		{[]string{"-broker", ""}, "-broker"},
		{[]string{"-event-prefix", ""}, "-event-prefix"},
		// -events names streams, subjects, exchanges and queues: a token
		// safe in all of them, or nothing starts.
		{[]string{"-events", ""}, "-events"},
		{[]string{"-events", "Shop"}, "-events"},
		{[]string{"-events", "1shop"}, "-events"},
		{[]string{"-events", "-shop"}, "-events"},
		{[]string{"-events", "shop.eu"}, "-events"},
		{[]string{"-events", "shop_eu"}, "-events"},
		{[]string{"-events", "shop>"}, "-events"},
		{[]string{"-events", "shop*"}, "-events"},
		{[]string{"-events", "shop eu"}, "-events"},
		{[]string{"-events", strings.Repeat("s", 33)}, "-events"},
		{[]string{"-event-retention", "59m"}, "-event-retention"},
		{[]string{"-event-retention", "-168h"}, "-event-retention"},
		{[]string{"-nats-store", ""}, "-nats-store"},
		{[]string{"extra"}, "unexpected"},
		// Empty, net.Listen would take every interface and a random port.
		{[]string{"-addr", ""}, "-addr"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "data")
			var args []string
			if !hasFlag(c.args, "-addr") {
				args = []string{"-addr", "127.0.0.1:0"}
			}
			for _, a := range c.args {
				args = append(args, strings.ReplaceAll(a, "DATA", dir))
			}
			if !hasFlag(args, "-data") && !hasFlag(args, "-db") {
				args = append(args, "-data", dir)
			}
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := shop.Run(ctx, args, &stdout, &stderr)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
			if strings.Contains(err.Error(), "secretpw") {
				t.Errorf("error %q shows the password", err)
			}
			if stdout.Len() > 0 {
				t.Errorf("printed %q", stdout.String())
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("data directory created (%v)", err)
			}
		})
	}
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name {
			return true
		}
	}
	return false
}

// An address shopd cannot listen on is refused before any data is
// touched: no data directory, no database file.
func TestRunRefusesUnusableAddrBeforeData(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests
	for _, addr := range []string{"nonsense", "127.0.0.1:99999", "127.0.0.1:-1", busy.Addr().String()} {
		t.Run(addr, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "data")
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := shop.Run(ctx, []string{"-addr", addr, "-data", dir}, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), "-addr") {
				t.Fatalf("error %v, want one naming -addr", err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("data directory created (%v)", err)
			}
		})
	}
}

// A stop requested while shopd is still starting (the first SIGINT or
// SIGTERM cancels Run's context) is a clean stop, not a failure to start:
// Run returns nil, whatever step the stop interrupted.
func TestRunStoppedDuringStartupIsClean(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr bytes.Buffer
	if err := shop.Run(ctx, []string{"-addr", "127.0.0.1:0", "-data", dir}, &stdout, &stderr); err != nil {
		t.Fatalf("Run stopped before serving: %v, want nil (a clean stop)", err)
	}
	if strings.Contains(stdout.String(), "listening") {
		t.Errorf("printed %q although it never served", stdout.String())
	}
}

// Without -write-timeout, a -read-timeout or -wait that leaves no room
// in the default write timeout moves it: shopd starts.
func TestRunDerivesWriteTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	stdout := &cancelOnListen{cancel: cancel}
	err := shop.Run(ctx, []string{"-addr", "127.0.0.1:0", "-data", t.TempDir(), "-read-timeout", "2m", "-wait", "45s"}, stdout, &stderr)
	if err != nil || !stdout.listened {
		t.Fatalf("Run: %v (listened %v), want a start and a clean stop; stderr:\n%s", err, stdout.listened, stderr.String())
	}
}

// cancelOnListen cancels once shopd says it listens.
type cancelOnListen struct {
	cancel   context.CancelFunc
	listened bool
}

func (c *cancelOnListen) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "listening") {
		c.listened = true
		c.cancel()
	}
	return len(p), nil
}
