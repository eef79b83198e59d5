package uniq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// The logic of InsertOrGet outside a transaction, with functions that
// stand for the statements (the database tests are in the cmd module).
func TestInsertOrGetLogic(t *testing.T) {
	t.Parallel()
	dup := &pgLike{"23505"}
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		opts        []Option
		insert      []error // the insert's answers, in turn
		get         []error // the get's answers, in turn
		want        int
		created     bool
		inserts     int
		gets        int
		errIs       []error
		unresolved  bool
		wantErrText string
	}{
		{name: "created", insert: []error{nil}, want: 1, created: true, inserts: 1},
		{name: "duplicate, found", insert: []error{dup}, get: []error{nil}, want: 2, inserts: 1, gets: 1},
		{name: "wrapped duplicate, found", insert: []error{fmt.Errorf("x: %w", dup)}, get: []error{nil}, want: 2, inserts: 1, gets: 1},
		{name: "other insert error", insert: []error{io.EOF}, inserts: 1, errIs: []error{io.EOF}},
		{name: "foreign key", insert: []error{&pgLike{"23503"}}, inserts: 1},
		{name: "get fails", insert: []error{dup}, get: []error{io.ErrUnexpectedEOF}, inserts: 1, gets: 1, errIs: []error{io.ErrUnexpectedEOF}},
		{name: "vanished, then created", insert: []error{dup, nil}, get: []error{sql.ErrNoRows}, want: 1, created: true, inserts: 2, gets: 1},
		{name: "vanished, then found", insert: []error{dup, dup}, get: []error{ErrNotFound, nil}, want: 2, inserts: 2, gets: 2},
		{name: "never found", insert: []error{dup, dup, dup}, get: []error{sql.ErrNoRows, sql.ErrNoRows, fmt.Errorf("w: %w", sql.ErrNoRows)},
			inserts: 3, gets: 3, errIs: []error{ErrUnresolved}, unresolved: true},
		{name: "never found, 1 attempt", opts: []Option{Attempts(1)}, insert: []error{dup}, get: []error{sql.ErrNoRows},
			inserts: 1, gets: 1, errIs: []error{ErrUnresolved}, unresolved: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var inserts, gets int
			insert := func(context.Context, Querier) (int, error) {
				err := tc.insert[inserts]
				inserts++
				if err != nil {
					return -1, err
				}
				return 1, nil
			}
			get := func(context.Context, Querier) (int, error) {
				err := tc.get[gets]
				gets++
				if err != nil {
					return -1, err
				}
				return 2, nil
			}
			v, created, err := InsertOrGet(ctx, nil, insert, get, tc.opts...)
			if inserts != tc.inserts || gets != tc.gets {
				t.Errorf("%d inserts and %d gets, want %d and %d", inserts, gets, tc.inserts, tc.gets)
			}
			wantErr := tc.errIs != nil || tc.name == "foreign key"
			if (err != nil) != wantErr {
				t.Fatalf("err = %v, want an error: %v", err, wantErr)
			}
			if err != nil {
				if v != 0 || created {
					t.Errorf("with an error: v = %d, created = %v", v, created)
				}
				for _, target := range tc.errIs {
					if !errors.Is(err, target) {
						t.Errorf("err = %v, not %v", err, target)
					}
				}
				if errors.Is(err, ErrNotVisible) {
					t.Errorf("err = %v is ErrNotVisible outside a transaction", err)
				}
				var ue *UnresolvedError
				if errors.As(err, &ue) != tc.unresolved {
					t.Errorf("err = %v: UnresolvedError %v, want %v", err, !tc.unresolved, tc.unresolved)
				}
				if tc.unresolved && (ue.Attempts != tc.inserts || ue.Tx || !IsDuplicate(err)) {
					t.Errorf("UnresolvedError %+v: want %d attempts, not in a tx, a duplicate", ue, tc.inserts)
				}
				return
			}
			if v != tc.want || created != tc.created {
				t.Errorf("got (%d, %v), want (%d, %v)", v, created, tc.want, tc.created)
			}
		})
	}
}

func TestInsertOrGetNeedsFunctions(t *testing.T) {
	t.Parallel()
	f := func(context.Context, Querier) (int, error) { return 0, nil }
	if _, _, err := InsertOrGet(context.Background(), nil, nil, f); err == nil {
		t.Error("nil insert accepted")
	}
	if _, _, err := InsertOrGet(context.Background(), nil, f, nil); err == nil {
		t.Error("nil get accepted")
	}
	for _, n := range []int{0, -1} {
		if _, _, err := InsertOrGet(context.Background(), nil, f, f, Attempts(n)); err == nil || !strings.Contains(err.Error(), "Attempts") {
			t.Errorf("Attempts(%d): %v, want an error naming Attempts", n, err)
		}
	}
}

// The two answers to a duplicate that get cannot find are told apart,
// and both keep the duplicate visible.
func TestNotVisibleAndUnresolvedErrors(t *testing.T) {
	t.Parallel()
	dup := &pgLike{"23505"}
	nv := error(&NotVisibleError{Isolation: "repeatable read", Err: dup})
	if !errors.Is(nv, ErrNotVisible) || errors.Is(nv, ErrUnresolved) || !IsDuplicate(nv) || !strings.Contains(nv.Error(), "retry the transaction") {
		t.Errorf("NotVisibleError: %v", nv)
	}
	ue := error(&UnresolvedError{Attempts: 3, Err: dup})
	if !errors.Is(ue, ErrUnresolved) || errors.Is(ue, ErrNotVisible) || !IsDuplicate(ue) {
		t.Errorf("UnresolvedError: %v", ue)
	}
	if !isPostgres(fmt.Errorf("w: %w", dup)) || isPostgres(io.EOF) {
		t.Error("isPostgres")
	}
}

// A transaction the database rolled back whole (a MySQL deadlock victim)
// takes its savepoints with it: InsertOrGet's answer keeps the insert's
// error visible, so the caller sees the deadlock and retries, and it is
// no duplicate (no get can run in a transaction that is gone).
func TestSavepointGoneKeepsInsertError(t *testing.T) {
	deadlock := errors.New("Error 1213: Deadlock found when trying to get lock")
	gone := errors.New("Error 1305: SAVEPOINT idem_uniq_1 does not exist")
	err := error(&rollbackError{err: fmt.Errorf("insert: %w", deadlock), rollback: gone})
	if !errors.Is(err, deadlock) || !errors.Is(err, gone) {
		t.Fatalf("errors.Is lost an error of %v", err)
	}
	dup := &rollbackError{err: &pgLike{"23505"}, rollback: gone}
	if IsDuplicate(dup) {
		t.Fatal("IsDuplicate of an insert whose savepoint is gone = true; no get can run")
	}
}
