package sqlstore_test

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/token"
)

func newTokenID(t *testing.T) string {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// TestTokenUpgrade: tokens an older build stored (no fingerprint column,
// no keep) are still answered after the migration that adds them: a used
// one with its result (a used token of earlier versions has no
// fingerprint, so no request is refused for it), an unused one spent
// now with the keep and the fingerprint, an expired one swept; on MySQL
// the migration runs again harmlessly after an interruption (its version
// not recorded).
func TestTokenUpgrade(t *testing.T) {
	forDialects(t, func(t *testing.T, srv server) {
		ctx := t.Context()
		db := migratedBefore(t, srv, "token_fingerprint_trim")
		now := time.Now().UnixMilli()
		used, unused, expired := newTokenID(t), newTokenID(t), newTokenID(t)
		for _, r := range []struct {
			id     string
			exp    int64
			usedAt any
			result any
		}{
			{used, now + 30*60*1000, now - 1000, []byte("ord_old")},
			{unused, now + 30*60*1000, nil, nil},
			{expired, now - 1, now - 60*60*1000, []byte("ord_gone")},
		} {
			d, _ := token.Digest(r.id)
			if _, err := db.ExecContext(ctx, srv.rebind(`INSERT INTO idem_tokens (digest, scope, created_at, expires_at, used_at, result) VALUES (?, 'user:1', ?, ?, ?, ?)`),
				d, now-60*60*1000, r.exp, r.usedAt, r.result); err != nil {
				t.Fatal(err)
			}
		}
		s := newTokenStore(t, db, srv.dialect) // migrates
		if srv.dialect == sqlstore.MySQL {
			if _, err := db.ExecContext(ctx, `DELETE FROM idem_schema_migrations WHERE version = ?`, migrationVersion(t, srv.dialect, "token_fingerprint_trim")); err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Migrate again after an interruption: %v", err)
			}
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		toks, err := token.New(s, &token.Config{MaxLive: -1})
		if err != nil {
			t.Fatal(err)
		}
		var ue *token.UsedError
		if err := toks.Consume(ctx, "user:1", used, token.Use{Request: []byte("sku=A"), Result: []byte("ord_new")}); !errors.As(err, &ue) || string(ue.Result) != "ord_old" || ue.Fingerprint != "" {
			t.Fatalf("Consume of a token used before the upgrade = %v, want a *UsedError with ord_old and no fingerprint", err)
		}
		if err := toks.Consume(ctx, "user:1", unused, token.Use{Request: []byte("sku=A"), Result: []byte("ord_1")}); err != nil {
			t.Fatalf("first use of a token issued before the upgrade: %v", err)
		}
		if err := toks.Consume(ctx, "user:1", unused, token.Use{Request: []byte("sku=B")}); !errors.Is(err, token.ErrMismatch) {
			t.Fatalf("another request under it = %v, want ErrMismatch", err)
		}
		d, _ := token.Digest(unused)
		var exp int64
		if err := db.QueryRowContext(ctx, srv.rebind(`SELECT expires_at FROM idem_tokens WHERE digest = ?`), d).Scan(&exp); err != nil {
			t.Fatal(err)
		}
		if exp < now+int64(token.DefaultKeep/time.Millisecond)-60_000 {
			t.Fatalf("the old token, used now, expires at %d, want about now + Keep (%d)", exp, now+int64(token.DefaultKeep/time.Millisecond))
		}
		if err := toks.Consume(ctx, "user:1", expired, token.Use{}); !errors.Is(err, token.ErrInvalid) {
			t.Fatalf("an expired old token = %v, want ErrInvalid", err)
		}
		if n, err := toks.Sweep(ctx, 0); err != nil || n != 1 {
			t.Fatalf("Sweep = %d, %v; want the expired old token, nil", n, err)
		}
		if n, err := s.Trim(ctx, "user:1", 0); err != nil || n != 0 {
			t.Fatalf("Trim = %d, %v; want 0 (both remaining tokens used)", n, err)
		}
	})
}
