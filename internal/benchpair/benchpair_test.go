package benchpair

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestOrder: over 2n iterations every iteration is a permutation, each
// function runs in each position exactly twice, and, in the calls as they
// follow each other, each function is preceded by every other.
func TestOrder(t *testing.T) {
	for n := 1; n <= 5; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			idx := make([]int, n)
			pos := make([][]int, n) // pos[f][p]: how often f ran at position p
			for f := range pos {
				pos[f] = make([]int, n)
			}
			var seq []int
			for i := range 2*n + 1 { // one more: the next round's first iteration
				order(idx, i)
				if !slices.Equal(slices.Sorted(slices.Values(idx)), seqN(n)) {
					t.Fatalf("iteration %d: %v is not a permutation", i, idx)
				}
				if i < 2*n {
					for p, f := range idx {
						pos[f][p]++
					}
				}
				seq = append(seq, idx...)
			}
			for f := range pos {
				for p, c := range pos[f] {
					if c != 2 {
						t.Errorf("function %d ran %d times at position %d, want 2", f, c, p)
					}
				}
			}
			after := make([]map[int]bool, n) // after[f]: the functions f ran right after
			for f := range after {
				after[f] = map[int]bool{}
			}
			for j := 1; j < len(seq); j++ {
				if seq[j-1] != seq[j] {
					after[seq[j]][seq[j-1]] = true
				}
			}
			for f := range after {
				if want := min(n-1, 2); len(after[f]) < want || n <= 3 && len(after[f]) != n-1 {
					t.Errorf("%d runs right after %v only", f, after[f])
				}
			}
		})
	}
	idx := make([]int, 3)
	var got [][]int
	for i := range 6 {
		order(idx, i)
		got = append(got, slices.Clone(idx))
	}
	want := [][]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}, {0, 2, 1}, {1, 0, 2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("orders of 3 = %v, want %v", got, want)
	}
}

func seqN(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestRun: each function runs exactly b.N times, in the order of order;
// Before runs right before its F and is not timed; the means and the
// ratio are reported.
func TestRun(t *testing.T) {
	const nap = 100 * time.Microsecond
	var (
		calls  [3]int
		before int
		log    []string // the first 6 iterations' calls
		means  []float64
		err    error
	)
	record := func(s string) {
		if len(log) < 6*4 { // 3 calls and 1 Before per iteration
			log = append(log, s)
		}
	}
	r := testing.Benchmark(func(b *testing.B) {
		means = Run(b,
			Func{Name: "a", F: func() { calls[0]++; record("a") }},
			Func{Name: "b", F: func() { calls[1]++; record("b") }, Before: func() {
				before++
				record("B")
				time.Sleep(nap)
			}},
			Func{Name: "c", F: func() { calls[2]++; record("c"); time.Sleep(nap) }},
		)
		Ratio(b, "x-a", 6, 3)
		Ratio(b, "x-zero", 1, 0)
		if b.N != calls[0] {
			err = fmt.Errorf("b.N = %d after Run, a ran %d times", b.N, calls[0])
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.N == 0 || calls != [3]int{r.N, r.N, r.N} || before != r.N {
		t.Fatalf("N = %d: calls %v, Before %d times; want each N", r.N, calls, before)
	}
	if r.N < 6 {
		t.Fatalf("N = %d, too few iterations to check the order", r.N)
	}
	want := []string{"a", "B", "b", "c", "B", "b", "c", "a", "c", "a", "B", "b",
		"c", "B", "b", "a", "a", "c", "B", "b", "B", "b", "a", "c"}
	if !slices.Equal(log, want) {
		t.Errorf("calls = %v, want %v", log, want)
	}
	if len(means) != 3 {
		t.Fatalf("Run returned %v, want 3 means", means)
	}
	for i, name := range []string{"a-ns", "b-ns", "c-ns"} {
		if r.Extra[name] != means[i] {
			t.Errorf("metric %s = %v, Run returned %v", name, r.Extra[name], means[i])
		}
	}
	// Sleeping lasts at least nap; a counter far less, unless Before's
	// nap were counted in b's time.
	if means[2] < float64(nap) {
		t.Errorf("c (sleeps %v) took %v ns on average", nap, means[2])
	}
	if means[0] >= float64(nap) || means[1] >= float64(nap) {
		t.Errorf("a and b (counters; b after a %v Before) took %v and %v ns on average", nap, means[0], means[1])
	}
	if r.Extra["x-a"] != 2 {
		t.Errorf("x-a = %v, want 2", r.Extra["x-a"])
	}
	if _, ok := r.Extra["x-zero"]; ok {
		t.Error("a ratio over zero was reported")
	}
}
