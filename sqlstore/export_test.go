package sqlstore

import "fmt"

// SQLiteDSN exposes the DSN of OpenSQLite to the benchmarks that compare
// connection settings.
var SQLiteDSN = sqliteDSN

// MigrationNames returns d's migrations as "VERSION_NAME", in order.
func MigrationNames(d Dialect) []string {
	var out []string
	for _, m := range d.migrations() {
		out = append(out, fmt.Sprintf("%d_%s", m.version, m.name))
	}
	return out
}
