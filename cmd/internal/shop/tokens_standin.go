package shop

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"sync"
	"time"
)

// This file is a stand-in for package token over sqlstore's TokenStore
// (token.Tokens: Issue, ConsumeTx), with the same calls, kept in memory
// until those land. Unlike the SQL store it does not spend a token in the
// caller's transaction: a token whose order was rolled back counts as
// unspent because its order does not exist, which is right one submission
// at a time but not for two concurrent ones.

var errTokenInvalid = errors.New("token: invalid or expired")

type tokenUsedError struct{ Result []byte }

func (e *tokenUsedError) Error() string { return "token: already used" }

type issuedToken struct {
	ID        string
	ExpiresAt time.Time
}

type memTokens struct {
	mu     sync.Mutex
	ttl    time.Duration
	tokens map[string]*memToken
	// exists reports whether the result of a use was committed.
	exists string
}

type memToken struct {
	scope   string
	expires time.Time
	used    bool
	result  []byte
}

func newMemTokens(orderExists string) *memTokens {
	return &memTokens{ttl: 30 * time.Minute, tokens: map[string]*memToken{}, exists: orderExists}
}

func (m *memTokens) Issue(ctx context.Context, scope string) (issuedToken, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return issuedToken{}, err
	}
	id := base64.RawURLEncoding.EncodeToString(b[:])
	exp := time.Now().Add(m.ttl)
	m.mu.Lock()
	m.tokens[id] = &memToken{scope: scope, expires: exp}
	m.mu.Unlock()
	return issuedToken{ID: id, ExpiresAt: exp}, nil
}

func (m *memTokens) ConsumeTx(ctx context.Context, tx *sql.Tx, scope, id string, result []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tokens[id]
	if t == nil || t.scope != scope || time.Now().After(t.expires) {
		return errTokenInvalid
	}
	if t.used {
		var one int
		err := tx.QueryRowContext(ctx, m.exists, string(t.result)).Scan(&one)
		if err == nil {
			return &tokenUsedError{Result: t.result}
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	t.used, t.result = true, append([]byte(nil), result...)
	return nil
}
