package redisstore_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/benchpair"
	"github.com/idemkit/idem/internal/throughput"
	"github.com/idemkit/idem/token"
)

// bareDel is the baseline of Consume: EVALSHA of a one-command script on
// one key, the least a script costs.
var bareDel = redis.NewScript(`return redis.call('DEL', KEYS[1])`)

// BenchmarkTokenVsBare measures the token operations against the bare
// Redis call each wraps, interleaved in one loop (internal/benchpair):
// Issue (random ID, SHA-256, one script) against SET NX PX; Consume of a
// fresh token and a repeated Consume (answered *UsedError) against
// EVALSHA of a DEL script. Fresh tokens are issued in Before, outside the
// timing.
//
//	go test -run '^$' -bench TokenVsBare -benchmem -count 3 ./redisstore/
func BenchmarkTokenVsBare(b *testing.B) {
	c := singleClient(b)
	s, prefix := newTokenStore(b, c)
	toks, err := token.New(s, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	if err := bareDel.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	bareKey := func() string { return prefix + ":bare:" + strconv.FormatInt(throughput.Next(), 10) }
	issue := func() token.Token {
		tok, err := toks.Issue(ctx, "user-1")
		if err != nil {
			b.Fatal(err)
		}
		return tok
	}
	evalDel := benchpair.Func{Name: "evalsha", F: func() {
		if err := bareDel.EvalSha(ctx, c, []string{prefix + ":bare"}).Err(); err != nil {
			b.Fatal(err)
		}
	}}
	result := []byte("order-0123456789")

	b.Run("issue", func(b *testing.B) {
		m := benchpair.Run(b,
			benchpair.Func{Name: "setnx", F: func() {
				if err := c.SetNX(ctx, bareKey(), "s", 30*time.Minute).Err(); err != nil {
					b.Fatal(err)
				}
			}},
			benchpair.Func{Name: "issue", F: func() { issue() }})
		benchpair.Ratio(b, "issue-x-setnx", m[1], m[0])
	})
	b.Run("consume", func(b *testing.B) {
		var tok token.Token
		m := benchpair.Run(b, evalDel,
			benchpair.Func{Name: "consume", Before: func() { tok = issue() }, F: func() {
				if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: result}); err != nil {
					b.Fatal(err)
				}
			}})
		benchpair.Ratio(b, "consume-x-evalsha", m[1], m[0])
	})
	b.Run("repeat", func(b *testing.B) {
		tok := issue()
		if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: result}); err != nil {
			b.Fatal(err)
		}
		m := benchpair.Run(b, evalDel,
			benchpair.Func{Name: "repeat", F: func() {
				var ue *token.UsedError
				if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: result}); !errors.As(err, &ue) {
					b.Fatal(err)
				}
			}})
		benchpair.Ratio(b, "repeat-x-evalsha", m[1], m[0])
	})
}
