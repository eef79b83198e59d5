package killsoak_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/idemkit/idem/cmd/internal/shop"
)

// envChildArgs makes the test binary a shopd process: with it set (a
// JSON array of arguments) TestMain runs shop.Main, as shopd does, and
// exits, so the tests kill real shopd processes.
const envChildArgs = "KILLSOAK_SHOPD_ARGS"

func TestMain(m *testing.M) {
	if raw := os.Getenv(envChildArgs); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		signals := make(chan os.Signal, 2)
		signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
		os.Exit(shop.Main(args, os.Stdout, os.Stderr, signals))
	}
	os.Exit(m.Run())
}
