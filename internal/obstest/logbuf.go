package obstest

import (
	"bytes"
	"sync"
)

// LogBuffer is a bytes.Buffer safe for concurrent writes: the writer of
// a test's slog handler, read while the code under test still logs.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
