package shop

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/cmd/internal/payprov"
)

// providerEnv is the environment variable of the payment provider's base
// URL, read when -provider is not given.
const providerEnv = "SHOPD_PROVIDER"

// crashEnv names a refund step after which shopd kills itself (SIGKILL):
// a test's way to crash it between two steps (Config.AfterStep).
const crashEnv = "SHOPD_CRASH_AFTER_STEP"

// Defaults of -provider-timeout and -complete-interval.
const (
	defaultProviderTimeout  = 10 * time.Second
	defaultCompleteInterval = 5 * time.Second
)

// flagSet returns the names of the flags fs was given.
func flagSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// checkProviderURL checks -provider (or $SHOPD_PROVIDER): an absolute
// http or https URL with a host.
func checkProviderURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("shopd: -provider %q must be the payment provider's base URL, http://host:port", raw)
	}
	return nil
}

// crashSteps are the names Config.AfterStep hears: the refund's and the
// card checkout's steps, and the moments after a provider answered.
var crashSteps = []string{StepRefunding, StepProviderCall, StepProvider, StepRefunded, StepRefused,
	StepCharging, StepChargeCall, StepCharge, StepDeclined, StepPaid, StepShipCall, StepShip, StepShipped}

// crashAfterStep returns the AfterStep hook of $SHOPD_CRASH_AFTER_STEP: it
// kills the process, at once and without cleanup (SIGKILL on Unix), when
// the step named there ends; nil when the variable is unset.
func crashAfterStep() (func(step string), error) {
	at := os.Getenv(crashEnv)
	if at == "" {
		return nil, nil
	}
	if !slices.Contains(crashSteps, at) {
		return nil, fmt.Errorf("shopd: $%s=%q names no step of a refund or a card checkout (%s)", crashEnv, at, strings.Join(crashSteps, ", "))
	}
	return func(step string) {
		if step != at {
			return
		}
		fmt.Fprintf(os.Stderr, "shopd: %s=%s: killing myself after step %s\n", crashEnv, at, step)
		p, err := os.FindProcess(os.Getpid())
		if err == nil {
			err = p.Kill()
		}
		// Kill does not return on success; if it failed, stop anyway.
		fmt.Fprintf(os.Stderr, "shopd: kill failed: %v\n", err)
		os.Exit(ExitInterrupted)
	}, nil
}

// startProvider starts the simulated payment provider (payprov) on a free
// loopback port, keeping its state in statePath when not empty, and
// returns its base URL and a function that stops it.
func startProvider(log *slog.Logger, statePath string) (stop func(), base string, err error) {
	srv, err := payprov.New(&payprov.Config{Logger: log.With("component", "payprov"), StatePath: statePath})
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, "", err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: maxReadHeaderTimeout}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	stop = func() {
		srv.Close() // ends the requests its faults hold
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			log.Warn("shopd: embedded payment provider: shutting down", "error", err)
		}
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("shopd: embedded payment provider", "error", err)
		}
	}
	return stop, "http://" + ln.Addr().String(), nil
}
