// Package benchpair measures operations interleaved in one benchmark
// loop, for ratios that a noisy machine does not swing.
//
// Two benchmarks run one after the other see different machines: on a
// shared VM the round trip to a local server drifts by tens of
// microseconds between runs, so the ratio of an operation to a baseline
// measured in a separate benchmark says more about the drift than about
// the operation. Run calls the operation and its baseline alternately in
// the same loop and times each call, so both means are taken over the
// same stretch of time.
//
// It guarantees that every function runs exactly once per iteration and
// in every position equally often (over whole rounds of rotations). It
// does not remove noise: a mean still moves between runs, only the ratio
// of means taken together is steadier. The benchmark's own ns/op is the
// cost of a whole iteration (every function, the timing, and any Before),
// not of one operation; read the "<name>-ns" metrics instead.
package benchpair

import (
	"slices"
	"testing"
	"time"
)

// A Func is one operation of Run.
type Func struct {
	// Name names the operation's metric: Run reports "<Name>-ns". It
	// must not contain spaces.
	Name string
	// F is the operation; it is timed. It fails the benchmark itself
	// (b.Fatal) on an error or an unexpected outcome.
	F func()
	// Before, if not nil, runs right before each call of F and is not
	// part of F's time: preparing the operation's input, such as a new
	// key or a lease. It may stop and restart b's timer, and must leave
	// it running.
	Before func()
}

// Run runs each of fns once per iteration of b.Loop, timing each call of
// F with time.Now, and returns the mean nanoseconds per call of each, in
// the order given. It also reports each mean as the metric "<Name>-ns".
//
// The order changes every iteration (see order), so that no function
// always runs right after another and each runs first, second, … equally
// often.
func Run(b *testing.B, fns ...Func) []float64 {
	b.Helper()
	if len(fns) == 0 {
		b.Fatal("benchpair.Run: no functions")
	}
	total := make([]time.Duration, len(fns))
	idx := make([]int, len(fns))
	n := 0
	for b.Loop() {
		order(idx, n)
		for _, k := range idx {
			f := fns[k]
			if f.Before != nil {
				f.Before()
			}
			t0 := time.Now()
			f.F()
			total[k] += time.Since(t0)
		}
		n++
	}
	means := make([]float64, len(fns))
	for k, f := range fns {
		if n > 0 {
			means[k] = float64(total[k].Nanoseconds()) / float64(n)
		}
		b.ReportMetric(means[k], f.Name+"-ns")
	}
	return means
}

// order fills idx with the order of iteration i of len(idx) functions:
// 0, 1, …, n-1 rotated left by i, and reversed in every other round of n
// iterations. Over 2n iterations each function runs in each position
// twice, and runs right after at least two different functions (after
// every other one when there are at most three: with three, the 6
// iterations are the 6 permutations).
func order(idx []int, i int) {
	n := len(idx)
	for j := range idx {
		idx[j] = (i + j) % n
	}
	if (i/n)%2 == 1 {
		slices.Reverse(idx)
	}
}

// Ratio reports num/den as the metric unit (such as "x-select1": the
// operation in multiples of SELECT 1), for means returned by Run. unit
// must not contain spaces. A zero den reports nothing.
func Ratio(b *testing.B, unit string, num, den float64) {
	b.Helper()
	if den == 0 {
		return
	}
	b.ReportMetric(num/den, unit)
}
