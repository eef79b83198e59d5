package retry

import (
	"testing"
	"time"
)

func TestAfter(t *testing.T) {
	var got []time.Duration
	for d := time.Duration(0); len(got) < 6; {
		d = After(d, 600*time.Millisecond)
		got = append(got, d)
	}
	want := []time.Duration{20, 40, 80, 160, 200, 200}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v; want %v ms", got, want)
		}
	}
	if d := After(0, 3*time.Millisecond); d != time.Millisecond {
		t.Fatalf("first wait of a 3 ms lease %v; want the 1 ms floor", d)
	}
	if d := After(time.Millisecond, 3*time.Millisecond); d != time.Millisecond {
		t.Fatalf("second wait of a 3 ms lease %v; want a third of it, 1 ms", d)
	}
}
