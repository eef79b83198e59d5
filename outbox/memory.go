package outbox

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// MemoryStore is a Store and a Notifier in one process's memory, for
// tests and single-process programs without a database. It is safe for
// concurrent use. A message's ID is NewID of the prefix given to
// NewMemoryStore, made when it is added: two stores (or two runs of a
// program) never give one ID to two messages.
type MemoryStore struct {
	mu        sync.Mutex
	prefix    string
	next      int64
	rows      []*memRow // by id
	listeners map[int]func()
	nextL     int
}

type memRow struct {
	id     int64
	msg    Message
	sent   bool
	sentAt time.Time
	held   *memBatch
}

var (
	_ Store        = (*MemoryStore)(nil)
	_ Notifier     = (*MemoryStore)(nil)
	_ BacklogStore = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty MemoryStore whose message IDs start
// with prefix (it may be empty). An ID is prefix and IDLen characters: a
// prefix longer than 229 bytes makes IDs longer than the 255 that an
// inbox takes, and every consumer refuses the messages.
func NewMemoryStore(prefix string) *MemoryStore {
	return &MemoryStore{prefix: prefix, listeners: map[int]func(){}}
}

// Add adds msg, pending, and returns its ID. It is Begin, Add and Commit
// in one.
func (s *MemoryStore) Add(ctx context.Context, msg Message) (string, error) {
	tx := s.Begin()
	id, err := tx.Add(ctx, msg)
	if err != nil {
		return "", err
	}
	tx.Commit()
	return id, nil
}

// MemoryTx is a transaction of a MemoryStore: its messages are added at
// Commit, or never if it is rolled back.
type MemoryTx struct {
	s    *MemoryStore
	rows []*memRow
	done bool
}

// Begin begins a transaction.
func (s *MemoryStore) Begin() *MemoryTx { return &MemoryTx{s: s} }

// Add adds msg to the transaction and returns its ID. It fails if msg is
// invalid (see Message.Validate) or the transaction ended.
func (tx *MemoryTx) Add(ctx context.Context, msg Message) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if err := msg.Validate(); err != nil {
		return "", err
	}
	if tx.done {
		return "", fmt.Errorf("outbox: MemoryTx.Add: transaction ended")
	}
	s := tx.s
	s.mu.Lock()
	s.next++
	r := &memRow{id: s.next, msg: msg}
	s.mu.Unlock()
	r.msg.ID = NewID(s.prefix)
	r.msg.Payload = slices.Clone(msg.Payload)
	r.msg.Headers = maps.Clone(msg.Headers)
	tx.rows = append(tx.rows, r)
	return r.msg.ID, nil
}

// Commit makes the transaction's messages pending and wakes listeners.
func (tx *MemoryTx) Commit() {
	if tx.done {
		return
	}
	tx.done = true
	if len(tx.rows) == 0 {
		return
	}
	s := tx.s
	s.mu.Lock()
	now := time.Now().Truncate(time.Millisecond)
	for _, r := range tx.rows {
		r.msg.CreatedAt = now
		i, _ := slices.BinarySearchFunc(s.rows, r.id, func(a *memRow, id int64) int { return cmpInt(a.id, id) })
		s.rows = slices.Insert(s.rows, i, r)
	}
	wakes := slices.Collect(maps.Values(s.listeners))
	s.mu.Unlock()
	for _, w := range wakes {
		w()
	}
}

// Rollback discards the transaction's messages.
func (tx *MemoryTx) Rollback() { tx.done = true; tx.rows = nil }

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Claim implements Store.
func (s *MemoryStore) Claim(ctx context.Context, limit int) (Batch, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("outbox: Claim: limit %d", limit)
	}
	b := &memBatch{s: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{} // keys with an older pending message
	for _, r := range s.rows {
		if len(b.rows) == limit {
			break
		}
		if r.sent {
			continue
		}
		if r.msg.Key != "" {
			if seen[r.msg.Key] {
				continue
			}
			seen[r.msg.Key] = true
		}
		if r.held != nil {
			continue
		}
		r.held = b
		b.rows = append(b.rows, r)
	}
	return b, nil
}

// Sweep implements Store.
func (s *MemoryStore) Sweep(ctx context.Context, retention time.Duration, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit <= 0 || retention < 0 {
		return 0, fmt.Errorf("outbox: Sweep: limit %d, retention %v", limit, retention)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cut := time.Now().Add(-retention)
	n := 0
	s.rows = slices.DeleteFunc(s.rows, func(r *memRow) bool {
		if n < limit && r.sent && !r.sentAt.After(cut) {
			n++
			return true
		}
		return false
	})
	return n, nil
}

// Backlog implements BacklogStore.
func (s *MemoryStore) Backlog(ctx context.Context) (Backlog, error) {
	if err := ctx.Err(); err != nil {
		return Backlog{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var b Backlog
	for _, r := range s.rows {
		if r.sent {
			continue
		}
		if b.Pending == 0 || r.msg.CreatedAt.Before(b.Oldest) {
			b.Oldest = r.msg.CreatedAt
		}
		b.Pending++
	}
	if b.Pending > 0 {
		b.Age = max(time.Since(b.Oldest), 0)
	}
	return b, nil
}

// Listen implements Notifier: it wakes on every Commit.
func (s *MemoryStore) Listen(ctx context.Context, wake func()) error {
	s.mu.Lock()
	id := s.nextL
	s.nextL++
	s.listeners[id] = wake
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, id)
		s.mu.Unlock()
	}()
	wake()
	<-ctx.Done()
	return ctx.Err()
}

type memBatch struct {
	s    *MemoryStore
	rows []*memRow
	done bool
}

func (b *memBatch) Messages() []Message {
	out := make([]Message, len(b.rows))
	for i, r := range b.rows {
		m := r.msg
		m.Payload = slices.Clone(m.Payload)
		m.Headers = maps.Clone(m.Headers)
		out[i] = m
	}
	return out
}

func (b *memBatch) MarkSent(ctx context.Context, ids []string) error {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	if b.done {
		return ErrBatchDone
	}
	mark := map[string]bool{}
	for _, id := range ids {
		if !slices.ContainsFunc(b.rows, func(r *memRow) bool { return r.msg.ID == id }) {
			return fmt.Errorf("outbox: MarkSent: %q is not in the batch", id)
		}
		mark[id] = true
	}
	now := time.Now()
	for _, r := range b.rows {
		if mark[r.msg.ID] {
			r.sent, r.sentAt = true, now
		}
		r.held = nil
	}
	b.done = true
	return nil
}

func (b *memBatch) Release(ctx context.Context) error {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	if b.done {
		return ErrBatchDone
	}
	for _, r := range b.rows {
		r.held = nil
	}
	b.done = true
	return nil
}

// Len returns how many messages the store holds, pending or sent.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rows)
}
