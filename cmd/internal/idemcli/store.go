package idemcli

import (
	"errors"
	"flag"
)

func init() {
	for _, c := range []struct{ name, synopsis string }{
		{"migrate", "create every idem table in a SQL database"},
		{"sweep", "remove expired records"},
		{"inspect", "show one record, or the in-flight and oldest ones"},
		{"evict", "delete one record"},
	} {
		register(c.name, &command{
			synopsis: c.synopsis,
			help:     "Usage: idem " + c.name + " -db DSN [flags]\n\nNot built yet.",
			flags: func(fs *flag.FlagSet) func(*env) int {
				return func(e *env) int { return fail(e, c.name, errors.New("not built yet")) }
			},
		})
	}
}
