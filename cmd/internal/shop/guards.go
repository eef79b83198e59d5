package shop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
)

// insertOrGet runs insert and, when it fails with a unique violation, get:
// it returns the row insert created (created = true) or the one already
// there. It never selects first: of concurrent calls on one key the
// database's unique index picks the creator. In a transaction the insert
// runs inside a SAVEPOINT, rolled back on a duplicate, so that the
// transaction stays usable on PostgreSQL. get should read with
// lockingRead on MySQL, whose REPEATABLE READ snapshot may predate the
// row.
//
// This is the shop's stand-in for the uniq package's InsertOrGet, kept in
// this one function so that the shop switches to the package in one place.
func insertOrGet[T any](ctx context.Context, tx *sql.Tx,
	insert func(ctx context.Context, q querier) (T, error),
	get func(ctx context.Context, q querier) (T, error)) (T, bool, error) {
	var zero T
	sp := fmt.Sprintf("shop_insert_or_get_%d", savepoints.Add(1))
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+sp); err != nil {
		return zero, false, err
	}
	v, err := insert(ctx, tx)
	if err == nil {
		if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+sp); err != nil {
			return zero, false, err
		}
		return v, true, nil
	}
	if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+sp); rerr != nil {
		return zero, false, errors.Join(err, rerr)
	}
	if !isDuplicate(err) {
		return zero, false, err
	}
	v, gerr := get(ctx, tx)
	if errors.Is(gerr, sql.ErrNoRows) {
		return zero, false, fmt.Errorf("a duplicate, and no row to read: %w", err)
	}
	return v, false, gerr
}

var savepoints atomic.Uint64

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
