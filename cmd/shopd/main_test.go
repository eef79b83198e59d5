package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// With SHOPD_MAIN set, the test binary runs shopd's main with the rest of
// its arguments.
func TestMain(m *testing.M) {
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
		{"-nosuchflag"},
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
