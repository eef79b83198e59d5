package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With SHOPD_MAIN set, the test binary runs shopd's main with the rest of
// its arguments.
func TestMain(m *testing.M) {
	runPayprovIfAsked()
	if os.Getenv("SHOPD_MAIN") == "1" {
		os.Args = append(os.Args[:1], os.Args[2:]...) // drop -test.run
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A bad flag value exits with status 2 and says why, before anything starts.
func TestBadFlagsExit2(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, args := range [][]string{
		{"-db", "nosuch://x"},
		{"-db", "mysql://app@db:3306/"},
		{"-redis", "http://cache:6379"},
		{"-events", "Shop.EU"},
		{"-nosuchflag"},
		{"-provider", "ftp://provider"},
		{"-lease", "1ms"},
		{"-complete-interval", "0s"},
		{"-provider-timeout", "-1s"},
		{"-addr", "nonsense"},
		{"-addr", busy.Addr().String()}, // a port in use
	} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
		cmd.Env = append(os.Environ(), "SHOPD_MAIN=1")
		cmd.Dir = t.TempDir() // -data's default, ./shopdata, must not appear
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%q: %v, want exit status 2; output %s", args, err, out)
			continue
		}
		if !strings.Contains(string(out), strings.TrimPrefix(args[0], "-")) {
			t.Errorf("%q: output %q does not name the flag", args, out)
		}
		if _, err := os.Stat(filepath.Join(cmd.Dir, "shopdata")); !os.IsNotExist(err) {
			t.Errorf("%q: shopdata created", args)
		}
	}
}

// A malformed OTLP endpoint is a configuration error too: exit status 2,
// a message that names the variable, and no data touched.
func TestBadOTLPEndpointExits2(t *testing.T) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$", "-addr", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "SHOPD_MAIN=1", "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", name+"=collector:4318")
		cmd.Dir = t.TempDir()
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("%s: %v, want exit status 2; output %s", name, err, out)
			continue
		}
		if !strings.Contains(string(out), name) {
			t.Errorf("%s: output %q does not name the variable", name, out)
		}
		if _, err := os.Stat(filepath.Join(cmd.Dir, "shopdata")); !os.IsNotExist(err) {
			t.Errorf("%s: shopdata created before the endpoint was checked", name)
		}
	}
}

// The first SIGINT lets in-flight requests finish; a second one during
// that drain ends shopd at once, with a non-zero status.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-addr", "127.0.0.1:0", "-data", dir, "-read-timeout", "5m")
	cmd.Env = append(os.Environ(), "SHOPD_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	addr := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if rest, ok := strings.CutPrefix(lines.Text(), "shopd listening on "); ok {
				addr <- strings.TrimPrefix(strings.Fields(rest)[0], "http://")
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	logLines := make(chan string, 100)
	var logged strings.Builder
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			logLines <- lines.Text()
		}
		close(logLines)
		exited <- cmd.Wait()
	}()
	var base string
	select {
	case base = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("shopd did not start listening")
	}

	// A request whose body stalls keeps the drain busy for as long as
	// shopd would wait for it.
	conn, err := net.Dial("tcp", base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: shop\r\nX-User-ID: 1\r\nIdempotency-Key: stalled\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"sku\":"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the server read the headers: the connection is active, not new

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitLog := func(want string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case line, ok := <-logLines:
				if !ok {
					t.Fatalf("shopd exited before logging %q; log:\n%s", want, logged.String())
				}
				logged.WriteString(line + "\n")
				if strings.Contains(line, want) {
					return
				}
			case <-timeout:
				t.Fatalf("shopd did not log %q; log:\n%s", want, logged.String())
			}
		}
	}
	waitLog("shutting down")
	// A signal within 250 ms of the first counts as that one delivered
	// twice; a person's second Ctrl-C comes later.
	time.Sleep(500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// The drain would last until the stalled request's 5 minute read
	// timeout or shopd's 30 s shutdown bound; the second signal ends it now.
	waitLog("second")
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
			t.Fatalf("shopd ended with %v, want a non-zero exit status", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("shopd still running 20 s after the second SIGINT")
	}
}

// SIGTERM while shopd is still starting (here: waiting for a database
// that accepts connections and never answers) stops it cleanly, at once
// and with status 0, like a SIGTERM while serving; it does not report a
// failure to start.
func TestSignalDuringStartupStopsCleanly(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		silent.Close()
		for c := range accepted {
			c.Close()
		}
	}()

	cmd := exec.Command(os.Args[0], "-test.run=^$", "-addr", "127.0.0.1:0",
		"-db", "mysql://shop@"+silent.Addr().String()+"/shop")
	cmd.Env = append(os.Environ(), "SHOPD_MAIN=1")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select { // shopd dialled the database: it is starting
	case c := <-accepted:
		defer c.Close()
	case err := <-exited:
		t.Fatalf("shopd exited before it reached the database: %v\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatal("shopd never dialled the database")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("shopd ended with %v after SIGTERM during startup, want status 0; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatal("shopd still running 20 s after SIGTERM during startup")
	}
	if strings.Contains(stdout.String(), "listening") {
		t.Errorf("shopd printed %q although it never served", stdout.String())
	}
}

// A log reader that goes away (shopd 2>&1 | tee shop.log, and Ctrl-C
// reaches tee too) does not kill shopd at its next log line: the drain
// after SIGINT still lets the in-flight request finish, and shopd exits 0.
func TestClosedLogPipeDoesNotKillDrain(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-addr", "127.0.0.1:0", "-data", t.TempDir(), "-read-timeout", "5m")
	cmd.Env = append(os.Environ(), "SHOPD_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logR, logW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logW
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logW.Close()
	exited := make(chan error, 1)
	addr := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if rest, ok := strings.CutPrefix(lines.Text(), "shopd listening on "); ok {
				addr <- strings.TrimPrefix(strings.Fields(rest)[0], "http://")
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	var base string
	select {
	case base = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("shopd did not start listening")
	}
	logR.Close() // the log reader goes away

	conn, err := net.Dial("tcp", base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"sku":"BOOK-1","quantity":1}`
	if _, err := io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: shop\r\nX-User-ID: 1\r\nIdempotency-Key: pipe\r\n"+
		"Content-Type: application/json\r\nConnection: close\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body[:4]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the server reads the headers: the connection is active
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // shopd logs that it shuts down, into the closed pipe
	if _, err := io.WriteString(conn, body[4:]); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the in-flight order got no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("in-flight order: %d, want 201", resp.StatusCode)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("shopd ended with %v, want status 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("shopd did not exit after the drain")
	}
}
