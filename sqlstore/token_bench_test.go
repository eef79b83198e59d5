package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/throughput"
	"github.com/idemkit/idem/sqlstore"
	"github.com/idemkit/idem/token"
)

// BenchmarkTokenVsBare measures the token operations against the bare
// statement each wraps, interleaved in one loop (internal/benchpair) on
// the same database: Issue (random ID, SHA-256, INSERT … RETURNING)
// against a prepared one-row INSERT into idem_tokens; Consume of a fresh
// token against a prepared UPDATE … WHERE digest = ? AND used_at IS NULL
// of a fresh row; and a repeated Consume (answered *UsedError, with the
// result) against a prepared SELECT of the row. Tokens and rows are made
// in Before, outside the timing.
//
//	go test -run '^$' -bench TokenVsBare -benchmem -count 3 ./sqlstore/
func BenchmarkTokenVsBare(b *testing.B) {
	targets := []server{sqliteServer, servers[0], servers[1]}
	for _, srv := range targets {
		b.Run(srv.dialect.String(), func(b *testing.B) {
			tokenBench(b, srv)
		})
	}
}

func tokenBench(b *testing.B, srv server) {
	ctx := context.Background()
	var db *sql.DB
	if srv.dialect == sqlstore.SQLite {
		db = openDB(b, b.TempDir()+"/tokens.db")
	} else {
		db = srv.open(b, "")
	}
	s := newTokenStore(b, db, srv.dialect)
	toks, err := token.New(s, nil)
	if err != nil {
		b.Fatal(err)
	}
	// The bare rows go under a scope of their own: they never expire, so
	// in the tokens' scope they would count as its newest unused tokens
	// and Issue's trim (Config.MaxLive) would remove the real ones.
	scope, bareScope := randomName("bench-"), randomName("bench-bare-")
	b.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), srv.rebind(`DELETE FROM idem_tokens WHERE scope LIKE 'bench-%'`))
	})
	prepare := func(q string) *sql.Stmt {
		st, err := db.PrepareContext(ctx, srv.rebind(q))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		return st
	}
	bareInsert := prepare(`INSERT INTO idem_tokens (digest, scope, created_at, expires_at) VALUES (?, ?, 0, 4102444800000)`)
	bareUpdate := prepare(`UPDATE idem_tokens SET used_at = 1, result = ? WHERE digest = ? AND used_at IS NULL`)
	bareSelect := prepare(`SELECT used_at, result FROM idem_tokens WHERE digest = ?`)
	insertRow := func() string {
		d := fmt.Sprintf("%016x%048x", time.Now().UnixNano(), throughput.Next())
		if _, err := bareInsert.ExecContext(ctx, d, bareScope); err != nil {
			b.Fatal(err)
		}
		return d
	}
	issue := func() token.Token {
		tok, err := toks.Issue(ctx, scope)
		if err != nil {
			b.Fatal(err)
		}
		return tok
	}
	uncapped, err := token.New(s, &token.Config{MaxLive: -1})
	if err != nil {
		b.Fatal(err)
	}
	issueUncapped := func() token.Token {
		tok, err := uncapped.Issue(ctx, scope)
		if err != nil {
			b.Fatal(err)
		}
		return tok
	}
	result := []byte("order-0123456789")

	// issue: a scope below Config.MaxLive (a fresh one each time), where
	// the trim after the insert removes nothing; issue-at-cap: one scope
	// holding MaxLive unused tokens, where each trim removes the oldest.
	var fresh int
	b.Run("issue", func(b *testing.B) {
		m := benchpair.Run(b,
			benchpair.Func{Name: "insert", F: func() { insertRow() }},
			benchpair.Func{Name: "issue", F: func() {
				fresh++
				if _, err := toks.Issue(ctx, fmt.Sprintf("%s-%d", scope, fresh)); err != nil {
					b.Fatal(err)
				}
			}})
		benchpair.Ratio(b, "issue-x-insert", m[1], m[0])
	})
	b.Run("issue-at-cap", func(b *testing.B) {
		for range token.DefaultMaxLive {
			issue()
		}
		m := benchpair.Run(b,
			benchpair.Func{Name: "insert", F: func() { insertRow() }},
			benchpair.Func{Name: "issue", F: func() { issue() }})
		benchpair.Ratio(b, "issue-x-insert", m[1], m[0])
	})
	b.Run("consume", func(b *testing.B) {
		var (
			d   string
			tok token.Token
		)
		m := benchpair.Run(b,
			benchpair.Func{Name: "update", Before: func() { d = insertRow() }, F: func() {
				res, err := bareUpdate.ExecContext(ctx, result, d)
				if err != nil {
					b.Fatal(err)
				}
				if n, _ := res.RowsAffected(); n != 1 {
					b.Fatalf("bare UPDATE changed %d rows", n)
				}
			}},
			// The tokens to spend are issued without the cap: each trim
			// at the cap deletes a row of this scope, and thousands of
			// dead rows in its index pages slowed the UPDATE round after
			// round (1.6× to 2.4× on PostgreSQL within one run), which is
			// the benchmark's churn, not a first use's cost.
			benchpair.Func{Name: "consume", Before: func() { tok = issueUncapped() }, F: func() {
				if err := toks.Consume(ctx, scope, tok.ID, token.Use{Result: result}); err != nil {
					b.Fatal(err)
				}
			}})
		benchpair.Ratio(b, "consume-x-update", m[1], m[0])
	})
	b.Run("repeat", func(b *testing.B) {
		tok := issue()
		if err := toks.Consume(ctx, scope, tok.ID, token.Use{Result: result}); err != nil {
			b.Fatal(err)
		}
		d, _ := token.Digest(tok.ID)
		m := benchpair.Run(b,
			benchpair.Func{Name: "select", F: func() {
				var usedAt sql.NullInt64
				var r []byte
				if err := bareSelect.QueryRowContext(ctx, d).Scan(&usedAt, &r); err != nil {
					b.Fatal(err)
				}
			}},
			benchpair.Func{Name: "repeat", F: func() {
				var ue *token.UsedError
				if err := toks.Consume(ctx, scope, tok.ID, token.Use{Result: result}); !errors.As(err, &ue) {
					b.Fatal(err)
				}
			}})
		benchpair.Ratio(b, "repeat-x-select", m[1], m[0])
	})
}
