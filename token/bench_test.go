package token_test

import (
	"context"
	"testing"

	"github.com/idemkit/idem/token"
)

// BenchmarkTokens measures what Tokens adds to a store: Issue (16 random
// bytes from crypto/rand, base64url, SHA-256) and Consume (form check,
// SHA-256) on a MemoryStore, and a repeated Consume next to the store's
// own.
//
//	go test -run '^$' -bench . -benchmem ./token/
func BenchmarkTokens(b *testing.B) {
	ctx := context.Background()
	s := token.NewMemoryStore()
	toks, err := token.New(s, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Issue", func(b *testing.B) {
		for b.Loop() {
			if _, err := toks.Issue(ctx, "user-1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	tok, err := toks.Issue(ctx, "user-1")
	if err != nil {
		b.Fatal(err)
	}
	if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{}); err != nil {
		b.Fatal(err)
	}
	d, _ := token.Digest(tok.ID)
	b.Run("ConsumeRepeat", func(b *testing.B) {
		for b.Loop() {
			if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{}); err == nil {
				b.Fatal("spent twice")
			}
		}
	})
	b.Run("StoreConsumeRepeat", func(b *testing.B) {
		for b.Loop() {
			if err := s.Consume(ctx, "user-1", d, token.Spend{}); err == nil {
				b.Fatal("spent twice")
			}
		}
	})
	b.Run("ConsumeMalformed", func(b *testing.B) {
		for b.Loop() {
			if err := toks.Consume(ctx, "user-1", "not-a-token", token.Use{}); err != token.ErrInvalid {
				b.Fatal(err)
			}
		}
	})
}
