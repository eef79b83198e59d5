package payprov_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/internal/payprov"
)

// childArgs, in the environment of the test binary, makes it run Main
// with these arguments (a JSON array) instead of the tests.
const childArgs = "PAYPROV_TEST_CHILD_ARGS"

func TestMain(m *testing.M) {
	if raw, ok := os.LookupEnv(childArgs); ok {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		status := payprov.Main(ctx, args, os.Stdout, os.Stderr)
		stop()
		os.Exit(status)
	}
	os.Exit(m.Run())
}

// A child is a provider running as a process of its own.
type child struct {
	cmd    *exec.Cmd
	client *payprov.Client
	stderr string
	// exited is closed when cmd.Wait returned.
	exited chan struct{}
}

var listening = regexp.MustCompile(`^payprov listening on (http://\S+)\n`)

// startChild runs the test binary as a provider with args and waits until
// it listens; the test's end kills it if it still runs.
func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stdout, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childArgs+"="+string(raw))
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	ch := &child{cmd: cmd, stderr: stderr.Name(), exited: exited}
	var url string
	waitFor(t, "the provider to listen", func() bool {
		out, err := os.ReadFile(stdout.Name())
		if err != nil {
			t.Fatal(err)
		}
		if m := listening.FindSubmatch(out); m != nil {
			url = string(m[1])
			return true
		}
		select {
		case <-exited:
			t.Fatalf("the provider exited (%v) before it listened: %s", cmd.ProcessState, ch.log(t))
		default:
		}
		return false
	})
	ch.client = &payprov.Client{BaseURL: url}
	return ch
}

func (ch *child) log(t *testing.T) string {
	raw, err := os.ReadFile(ch.stderr)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// stop sends sig to the child and returns how it ended.
func (ch *child) stop(t *testing.T, sig os.Signal) *os.ProcessState {
	t.Helper()
	if err := ch.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch.exited:
	case <-time.After(time.Minute):
		t.Fatalf("the provider did not exit after %v", sig)
	}
	return ch.cmd.ProcessState
}

// TestProcess runs the provider as a separate process: a refund whose
// answer is lost after the effect, its retry, a SIGKILL, a restart on the
// same state file, and a SIGTERM with a request held by a fault.
func TestProcess(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "state.json")
	ch := startChild(t, "-state", state)
	c := ch.client
	ctx := context.Background()
	if err := c.RegisterPayment(ctx, payprov.Payment{Payment: "pay_1", AmountCents: 1299}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetFault(ctx, payprov.Fault{Path: "/v1/refunds", Mode: payprov.FaultTimeoutAfterEffect, Count: 1}); err != nil {
		t.Fatal(err)
	}
	callCtx, cancel := context.WithCancel(ctx)
	result := make(chan error, 1)
	go func() {
		_, err := c.Refund(callCtx, "k1", refund)
		result <- err
	}()
	waitFor(t, "the refund", func() bool { return len(refunds(t, c)) == 1 })
	cancel()
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Fatalf("the call whose answer was lost: %v", err)
	}
	made := wantOneRefund(t, c, "k1")
	got, err := c.Refund(ctx, "k1", refund)
	if err != nil || got != made {
		t.Fatalf("retry: %+v, %v; want %+v", got, err, made)
	}

	if ps := ch.stop(t, syscall.SIGKILL); ps.Success() {
		t.Fatalf("killed provider: %v", ps)
	}
	ch = startChild(t, "-state", state)
	c = ch.client
	if got, err := c.Refund(ctx, "k1", refund); err != nil || got != made {
		t.Fatalf("retry after a restart: %+v, %v; want %+v", got, err, made)
	}
	var refused *payprov.RefusedError
	if _, err := c.Refund(ctx, "k2", refund); !errors.As(err, &refused) {
		t.Fatalf("a second refund of the payment after a restart: %v; want refused", err)
	}
	wantOneRefund(t, c, "k1")

	if err := c.SetFault(ctx, payprov.Fault{Mode: payprov.FaultHang}); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := c.Refund(ctx, "k3", refund)
		result <- err
	}()
	waitFor(t, "the held request", func() bool { return keyState(t, c, payprov.KindRefund, "k3").Requests == 1 })
	if ps := ch.stop(t, syscall.SIGTERM); !ps.Success() {
		t.Fatalf("provider stopped by SIGTERM: %v\n%s", ps, ch.log(t))
	}
	if err := <-result; err == nil || !payprov.Retryable(err) {
		t.Fatalf("the held request: %v; want a retryable error", err)
	}
}

func TestMainFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-nope"}, {"extra"}, {"-addr", "256.0.0.1:1"}, {"-refund-limit", "-1"}} {
		if status := payprov.Main(context.Background(), args, io.Discard, io.Discard); status != 2 {
			t.Errorf("Main %q: status %d; want 2", args, status)
		}
	}
}
