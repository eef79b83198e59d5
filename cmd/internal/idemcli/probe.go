package idemcli

import (
	"errors"
	"flag"
)

func init() {
	register("probe", &command{
		synopsis: "check an API's Idempotency-Key semantics",
		help:     "Usage: idem probe [flags] URL\n\nNot built yet.",
		flags: func(fs *flag.FlagSet) func(*env) int {
			return func(e *env) int { return fail(e, "probe", errors.New("not built yet")) }
		},
	})
}
