package token_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/obstest"
	"github.com/idemkit/idem/token"
	"github.com/idemkit/idem/token/tokentest"
)

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	tokentest.Run(t, func(*testing.T) token.Store { return token.NewMemoryStore() }, tokentest.Caps{})
}

// countingStore counts the calls that reach it.
type countingStore struct {
	token.Store
	calls atomic.Int64
}

func (c *countingStore) Insert(ctx context.Context, scope, digest string, ttl time.Duration) (time.Time, error) {
	c.calls.Add(1)
	return c.Store.Insert(ctx, scope, digest, ttl)
}

func (c *countingStore) Consume(ctx context.Context, scope, digest string, s token.Spend) error {
	c.calls.Add(1)
	return c.Store.Consume(ctx, scope, digest, s)
}

func newTokens(t *testing.T, cfg *token.Config) (*token.Tokens, *countingStore) {
	t.Helper()
	s := &countingStore{Store: token.NewMemoryStore()}
	toks, err := token.New(s, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return toks, s
}

func TestIssueConsume(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	toks, _ := newTokens(t, nil)
	before := time.Now()
	tok, err := toks.Issue(ctx, "user-1")
	if err != nil {
		t.Fatal(err)
	}
	if !token.ValidID(tok.ID) || len(tok.ID) != token.IDLen || tok.Scope != "user-1" {
		t.Fatalf("Issue = %+v, want a valid ID of scope user-1", tok)
	}
	if d := tok.ExpiresAt.Sub(before); d < token.DefaultTTL || d > token.DefaultTTL+time.Minute {
		t.Fatalf("ExpiresAt - issue time = %v, want about %v", d, token.DefaultTTL)
	}
	if err := toks.Consume(ctx, "user-2", tok.ID, token.Use{}); err != token.ErrInvalid {
		t.Fatalf("Consume under another scope = %v, want ErrInvalid itself", err)
	}
	if err := toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: []byte("order-1")}); err != nil {
		t.Fatalf("first Consume = %v", err)
	}
	err = toks.Consume(ctx, "user-1", tok.ID, token.Use{Result: []byte("order-2")})
	var ue *token.UsedError
	if !errors.As(err, &ue) || !errors.Is(err, token.ErrUsed) || string(ue.Result) != "order-1" {
		t.Fatalf("second Consume = %v, want a *UsedError with order-1", err)
	}
	if !strings.HasPrefix(err.Error(), "token: already used at ") {
		t.Fatalf("UsedError text = %q", err)
	}
	if errors.Is(err, token.ErrInvalid) || errors.Is(token.ErrInvalid, token.ErrUsed) {
		t.Fatal("ErrUsed and ErrInvalid must be told apart")
	}
}

func TestIDsAreRandomAndDistinct(t *testing.T) {
	t.Parallel()
	toks, _ := newTokens(t, nil)
	seen := map[string]bool{}
	for range 1000 {
		tok, err := toks.Issue(t.Context(), "s")
		if err != nil {
			t.Fatal(err)
		}
		if seen[tok.ID] {
			t.Fatalf("ID %q issued twice", tok.ID)
		}
		seen[tok.ID] = true
	}
}

// TestRefusedWithoutIO: malformed IDs, bad scopes and oversized results are
// answered before the store is called.
func TestRefusedWithoutIO(t *testing.T) {
	t.Parallel()
	toks, s := newTokens(t, nil)
	good, err := toks.Issue(t.Context(), "u")
	if err != nil {
		t.Fatal(err)
	}
	s.calls.Store(0)
	last := good.ID[token.IDLen-1:]
	tests := []struct {
		name, scope, id string
		result          []byte
		want            error
	}{
		{"empty id", "u", "", nil, token.ErrInvalid},
		{"short id", "u", good.ID[:21], nil, token.ErrInvalid},
		{"long id", "u", good.ID + "A", nil, token.ErrInvalid},
		{"padded", "u", good.ID[:20] + "==", nil, token.ErrInvalid},
		{"standard alphabet", "u", strings.Repeat("+", 21) + "A", nil, token.ErrInvalid},
		{"slash", "u", strings.Repeat("/", 21) + "A", nil, token.ErrInvalid},
		{"space", "u", " " + good.ID[1:], nil, token.ErrInvalid},
		{"non-canonical last char", "u", good.ID[:21] + nonCanonical(last), nil, token.ErrInvalid},
		{"digest instead of ID", "u", mustDigest(t, good.ID), nil, token.ErrInvalid},
		{"empty scope", "", good.ID, nil, token.ErrScope},
		{"long scope", strings.Repeat("s", token.MaxScopeLen+1), good.ID, nil, token.ErrScope},
		{"control char scope", "u\n", good.ID, nil, token.ErrScope},
		{"invalid utf-8 scope", "u\xff", good.ID, nil, token.ErrScope},
		{"result too large", "u", good.ID, make([]byte, token.MaxResultLen+1), token.ErrResultTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := toks.Consume(t.Context(), tt.scope, tt.id, token.Use{Result: tt.result})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Consume = %v, want %v", err, tt.want)
			}
		})
	}
	if n := s.calls.Load(); n != 0 {
		t.Fatalf("%d calls reached the store, want 0", n)
	}
	if _, err := toks.Issue(t.Context(), ""); !errors.Is(err, token.ErrScope) {
		t.Fatalf("Issue with an empty scope = %v, want ErrScope", err)
	}
	if n := s.calls.Load(); n != 0 {
		t.Fatalf("Issue with an empty scope reached the store")
	}
	// The token is still unused, and MaxResultLen itself is accepted.
	if err := toks.Consume(t.Context(), "u", good.ID, token.Use{Result: make([]byte, token.MaxResultLen)}); err != nil {
		t.Fatalf("Consume of the untouched token = %v", err)
	}
}

// nonCanonical returns another spelling of the last character of an ID:
// the same 2 data bits with a non-zero unused bit.
func nonCanonical(last string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return string(alphabet[strings.Index(alphabet, last)|1])
}

func mustDigest(t *testing.T, id string) string {
	t.Helper()
	d, err := token.Digest(id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDigest(t *testing.T) {
	t.Parallel()
	// The SHA-256 of the ID's characters, in hex.
	d, err := token.Digest("AAAAAAAAAAAAAAAAAAAAAA")
	if err != nil {
		t.Fatal(err)
	}
	if d != sha256Hex("AAAAAAAAAAAAAAAAAAAAAA") {
		t.Fatalf("Digest = %s", d)
	}
	if _, err := token.Digest("not a token"); err != token.ErrInvalid {
		t.Fatalf("Digest of a malformed ID = %v, want ErrInvalid", err)
	}
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	s := token.NewMemoryStore()
	if _, err := token.New(nil, nil); err == nil {
		t.Error("New(nil store) succeeded")
	}
	for _, ttl := range []time.Duration{-time.Second, time.Millisecond, token.MinTTL - 1, token.MaxTTL + 1} {
		if _, err := token.New(s, &token.Config{TTL: ttl}); err == nil {
			t.Errorf("New with TTL %v succeeded", ttl)
		}
	}
	for _, ttl := range []time.Duration{0, token.MinTTL, token.MaxTTL, 15 * time.Minute} {
		toks, err := token.New(s, &token.Config{TTL: ttl})
		if err != nil {
			t.Errorf("New with TTL %v: %v", ttl, err)
			continue
		}
		want := ttl
		if ttl == 0 {
			want = token.DefaultTTL
		}
		if toks.TTL() != want {
			t.Errorf("TTL() = %v, want %v", toks.TTL(), want)
		}
	}
}

func TestRandSource(t *testing.T) {
	t.Parallel()
	// The ID is the 16 bytes Rand gives, in base64url.
	src := bytes.Repeat([]byte{0xfb}, 16)
	toks, _ := newTokens(t, &token.Config{Rand: bytes.NewReader(src)})
	tok, err := toks.Issue(t.Context(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if want := base64.RawURLEncoding.EncodeToString(src); tok.ID != want {
		t.Fatalf("ID = %q, want %q", tok.ID, want)
	}
	// A source that runs dry fails Issue and stores nothing.
	if _, err := toks.Issue(t.Context(), "s"); !errors.Is(err, io.EOF) {
		t.Fatalf("Issue from an empty source = %v, want io.EOF", err)
	}
	// A source that repeats itself meets ErrDuplicate.
	toks, _ = newTokens(t, &token.Config{Rand: zeroReader{}})
	if _, err := toks.Issue(t.Context(), "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := toks.Issue(t.Context(), "s"); !errors.Is(err, token.ErrDuplicate) {
		t.Fatalf("second Issue from a constant source = %v, want ErrDuplicate", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestConsumeTxUnsupported(t *testing.T) {
	t.Parallel()
	toks, _ := newTokens(t, nil)
	tok, err := toks.Issue(t.Context(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := toks.ConsumeTx(t.Context(), nil, "s", tok.ID, token.Use{}); !errors.Is(err, token.ErrTxUnsupported) {
		t.Fatalf("ConsumeTx on a MemoryStore = %v, want ErrTxUnsupported", err)
	}
}

// failingStore fails every call.
type failingStore struct{}

var errDown = errors.New("store down")

func (failingStore) Insert(context.Context, string, string, time.Duration) (time.Time, error) {
	return time.Time{}, errDown
}
func (failingStore) Consume(context.Context, string, string, token.Spend) error { return errDown }
func (failingStore) Sweep(context.Context, int) (int, error)                    { return 0, errDown }
func (failingStore) Trim(context.Context, string, int) (int, error)             { return 0, errDown }

func TestStoreErrorsWrapped(t *testing.T) {
	t.Parallel()
	toks, err := token.New(failingStore{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := toks.Issue(t.Context(), "s"); !errors.Is(err, errDown) || !strings.HasPrefix(err.Error(), "token: issue: ") {
		t.Errorf("Issue = %v", err)
	}
	err = toks.Consume(t.Context(), "s", "AAAAAAAAAAAAAAAAAAAAAA", token.Use{})
	if !errors.Is(err, errDown) || errors.Is(err, token.ErrInvalid) || errors.Is(err, token.ErrUsed) {
		t.Errorf("Consume = %v", err)
	}
	if _, err := toks.Sweep(t.Context(), 0); !errors.Is(err, errDown) {
		t.Errorf("Sweep = %v", err)
	}
}

func TestSweepDefaultLimit(t *testing.T) {
	t.Parallel()
	s := &limitStore{}
	toks, err := token.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{-1, 0} {
		if _, err := toks.Sweep(t.Context(), limit); err != nil || s.limit != token.DefaultSweepLimit {
			t.Errorf("Sweep(%d) passed limit %d, %v; want %d", limit, s.limit, err, token.DefaultSweepLimit)
		}
	}
}

type limitStore struct {
	failingStore
	limit int
}

func (l *limitStore) Sweep(_ context.Context, limit int) (int, error) { l.limit = limit; return 0, nil }

func FuzzValidID(f *testing.F) {
	for _, s := range []string{"AAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAB", "", "_-_-_-_-_-_-_-_-_-_-_w", "AAAAAAAAAAAAAAAAAAAA=="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		ok := token.ValidID(id)
		d, err := token.Digest(id)
		if ok != (err == nil) {
			t.Fatalf("ValidID = %v but Digest error = %v", ok, err)
		}
		if !ok {
			return
		}
		// A valid ID is the one spelling of its 16 bytes.
		b, err := base64.RawURLEncoding.DecodeString(id)
		if err != nil || len(b) != 16 || base64.RawURLEncoding.EncodeToString(b) != id {
			t.Fatalf("valid ID %q does not round-trip: %x, %v", id, b, err)
		}
		if len(d) != token.DigestLen || strings.ToLower(d) != d {
			t.Fatalf("Digest(%q) = %q", id, d)
		}
	})
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// trimFailing stores tokens in memory but fails every Trim.
type trimFailing struct {
	*token.MemoryStore
	trims atomic.Int64
}

func (s *trimFailing) Trim(context.Context, string, int) (int, error) {
	s.trims.Add(1)
	return 0, errDown
}

// A Trim that fails after the token was stored does not fail the Issue:
// the token is good, and the Observer hears of the failure.
func TestIssueTrimFails(t *testing.T) {
	t.Parallel()
	rec := &obstest.Recorder{}
	s := &trimFailing{MemoryStore: token.NewMemoryStore()}
	toks, err := token.New(s, &token.Config{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := toks.Issue(t.Context(), "u")
	if err != nil {
		t.Fatalf("Issue with a failing Trim: %v", err)
	}
	if err := toks.Consume(t.Context(), "u", tok.ID, token.Use{}); err != nil {
		t.Fatalf("Consume of the token: %v", err)
	}
	var trim []idem.Event
	for _, e := range rec.Ends(idem.KindToken) {
		if e.Op == idem.OpTrim {
			trim = append(trim, e)
		}
	}
	if len(trim) != 1 || trim[0].Outcome != idem.OutcomeError || !errors.Is(trim[0].Err, errDown) {
		t.Fatalf("trim events %+v, want one error", trim)
	}
	// MaxLive < 0: no trim at all.
	toks, _ = token.New(s, &token.Config{MaxLive: -1})
	if _, err := toks.Issue(t.Context(), "u"); err != nil || s.trims.Load() != 1 {
		t.Fatalf("Issue with MaxLive -1: %v, %d trims; want none", err, s.trims.Load()-1)
	}
}

// Issue keeps MaxLive unused tokens per scope: the newest.
func TestIssueMaxLive(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ maxLive, want int }{{0, token.DefaultMaxLive}, {3, 3}, {-1, 50}} {
		toks, _ := newTokens(t, &token.Config{MaxLive: tt.maxLive})
		var ids []string
		for range 50 {
			tok, err := toks.Issue(t.Context(), "u")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, tok.ID)
		}
		other, _ := toks.Issue(t.Context(), "v")
		live := 0
		for i := len(ids) - 1; i >= 0; i-- {
			err := toks.Consume(t.Context(), "u", ids[i], token.Use{})
			if err == nil {
				live++
				if i < len(ids)-tt.want {
					t.Errorf("MaxLive %d: token %d of 50 survived", tt.maxLive, i)
				}
			} else if i >= len(ids)-tt.want {
				t.Errorf("MaxLive %d: token %d of 50 (among the newest) = %v", tt.maxLive, i, err)
			}
		}
		if live != tt.want {
			t.Errorf("MaxLive %d: %d live, want %d", tt.maxLive, live, tt.want)
		}
		if err := toks.Consume(t.Context(), "v", other.ID, token.Use{}); err != nil {
			t.Errorf("another scope's token: %v", err)
		}
	}
}

func TestConfigKeep(t *testing.T) {
	t.Parallel()
	toks, _ := newTokens(t, nil)
	if toks.Keep() != token.DefaultKeep || token.DefaultKeep != idem.DefaultRetention {
		t.Fatalf("default Keep %v", toks.Keep())
	}
	for _, bad := range []time.Duration{-time.Second, time.Millisecond, token.MaxKeep + 1} {
		if _, err := token.New(token.NewMemoryStore(), &token.Config{Keep: bad}); err == nil {
			t.Errorf("Keep %v accepted", bad)
		}
	}
}

// Tokens passes its Keep and the request's fingerprint to the store.
type spyStore struct {
	*token.MemoryStore
	last token.Spend
}

func (s *spyStore) Consume(ctx context.Context, scope, digest string, sp token.Spend) error {
	s.last = sp
	return s.MemoryStore.Consume(ctx, scope, digest, sp)
}

func TestConsumeSpend(t *testing.T) {
	t.Parallel()
	s := &spyStore{MemoryStore: token.NewMemoryStore()}
	toks, _ := token.New(s, &token.Config{Keep: 2 * time.Hour})
	tok, _ := toks.Issue(t.Context(), "u")
	req := []byte("quantity=1&sku=A")
	if err := toks.Consume(t.Context(), "u", tok.ID, token.Use{Request: req, Result: []byte("o")}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(req)
	if s.last.Keep != 2*time.Hour || s.last.Fingerprint != hex.EncodeToString(sum[:]) || string(s.last.Result) != "o" {
		t.Fatalf("Spend %+v", s.last)
	}
	// An empty request is a request (its SHA-256), unlike nil.
	tok, _ = toks.Issue(t.Context(), "u")
	if err := toks.Consume(t.Context(), "u", tok.ID, token.Use{Request: []byte{}}); err != nil || s.last.Fingerprint != token.Fingerprint(nil) {
		t.Fatalf("empty request: %v, %+v", err, s.last)
	}
	var me *token.MismatchError
	if err := toks.Consume(t.Context(), "u", tok.ID, token.Use{Request: req}); !errors.As(err, &me) || !strings.Contains(err.Error(), "different request") {
		t.Fatalf("Consume with another request = %v", err)
	}
}
