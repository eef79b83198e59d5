package shop

import (
	"context"
	"database/sql"
	"strings"

	"github.com/idemkit/idem/uniq"
)

// insertOrGet runs insert and, when it fails with a unique violation, get
// (uniq.InsertOrGet: insert first, read on conflict): it returns the row
// insert created (created = true) or the one already there. In a
// transaction the insert runs inside a savepoint, so that the transaction
// stays usable on PostgreSQL. get should read with lockingRead on MySQL,
// whose REPEATABLE READ snapshot may predate the row. A deadlock that
// MySQL answered by rolling the whole transaction back (its savepoints
// with it) stays visible to retryable: uniq keeps the insert's error.
func insertOrGet[T any](ctx context.Context, tx *sql.Tx,
	insert func(ctx context.Context, q querier) (T, error),
	get func(ctx context.Context, q querier) (T, error)) (T, bool, error) {
	return uniq.InsertOrGet(ctx, tx,
		func(ctx context.Context, q uniq.Querier) (T, error) { return insert(ctx, q) },
		func(ctx context.Context, q uniq.Querier) (T, error) { return get(ctx, q) })
}

// pathHasSegments reports whether path is /a/{any}/c for segments a, "", c
// ("" matches any one non-empty segment).
func pathHasSegments(path string, segments ...string) bool {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(parts) != len(segments) {
		return false
	}
	for i, s := range segments {
		if parts[i] == "" || (s != "" && parts[i] != s) {
			return false
		}
	}
	return true
}
