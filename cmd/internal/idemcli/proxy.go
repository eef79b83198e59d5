package idemcli

import (
	"errors"
	"flag"
)

func init() {
	register("proxy", &command{
		synopsis: "an idempotency gateway in front of any HTTP service",
		help:     "Usage: idem proxy -upstream URL [flags]\n\nNot built yet.",
		flags: func(fs *flag.FlagSet) func(*env) int {
			return func(e *env) int { return fail(e, "proxy", errors.New("not built yet")) }
		},
	})
}
