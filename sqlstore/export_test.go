package sqlstore

import (
	"context"
	"fmt"
)

// MigrationNames returns d's migrations as "VERSION_NAME", in order.
func MigrationNames(d Dialect) []string {
	var out []string
	for _, m := range d.migrations() {
		out = append(out, fmt.Sprintf("%d_%s", m.version, m.name))
	}
	return out
}

// MigrateTo applies s's migrations up to version upTo only, as an older
// build would have.
func MigrateTo(ctx context.Context, s *Store, upTo int64) error { return s.migrate(ctx, upTo) }
