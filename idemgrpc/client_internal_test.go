package idemgrpc

import (
	"testing"
	"time"
)

// TestBackoff: the wait before retry n lies in [0, min(MaxDelay,
// BaseDelay·2^(n-1))] and is spread over it (full jitter), for any n.
func TestBackoff(t *testing.T) {
	c, err := NewClient(&ClientConfig{BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for n, ceiling := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond, 4: 80 * time.Millisecond,
		5: 100 * time.Millisecond, 70: 100 * time.Millisecond, 1 << 20: 100 * time.Millisecond} {
		low, high := false, false
		for range 2000 {
			d := c.backoff(n)
			if d < 0 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, outside [0, %v]", n, d, ceiling)
			}
			low = low || d < ceiling/4
			high = high || d > ceiling*3/4
		}
		if !low || !high {
			t.Errorf("backoff(%d): 2000 waits not spread over [0, %v] (some below a quarter: %v, above three quarters: %v)", n, ceiling, low, high)
		}
	}
}
