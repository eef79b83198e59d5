package lincheck

import (
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/anishathalye/porcupine"
)

// porcupineModel is the checker's model type.
type porcupineModel = porcupine.Model

// Never is the return time of a call whose outcome is unknown (it failed
// with an error that does not say whether it took effect): it may take
// effect at any time after it began.
const Never = math.MaxInt64 / 4

// window is the instant of a call: somewhere in [Call, Ret], in Unix
// nanoseconds of the machine's clock.
type window struct{ Call, Ret int64 }

// clock compares instants the model knows only as intervals, allowing
// Margin on each side for the clocks' granularity (a store keeps
// milliseconds, say) and rounding.
type clock struct{ margin int64 }

// mayHaveCome reports whether an instant in [lo, ...] may be at or before
// the call's instant: a lease or a retention ending then may have ended.
func (k clock) mayHaveCome(lo int64, w window) bool { return lo-k.margin <= w.Ret }

// mayBeAhead reports whether an instant in [..., hi] may be after the
// call's instant: a lease ending then may still run.
func (k clock) mayBeAhead(hi int64, w window) bool { return hi+k.margin > w.Call }

// within reports whether v lies in [lo, hi], give or take the margin.
func (k clock) within(v, lo, hi int64) bool { return lo-k.margin <= v && v <= hi+k.margin }

// add is a + b, saturating at Never.
func add(a, b int64) int64 {
	if a >= Never || b >= Never {
		return Never
	}
	return min(a+b, Never)
}

// describeTime prints an instant as the seconds of the clock modulo
// 1000, to the microsecond: the calls' windows and the records' times read
// on one scale.
func describeTime(v int64) string {
	if v >= Never {
		return "∞"
	}
	return fmt.Sprintf("%.6f", float64(v%int64(1000*time.Second))/1e9)
}

// hashOf hashes a comparable state for porcupine's cache.
func hashOf[T comparable](seed maphash.Seed, v T) uint64 { return maphash.Comparable(seed, v) }

// nondeterministic turns a step over typed states into porcupine's model.
func nondeterministic[S comparable, I, O any](
	partition func([]porcupine.Operation) [][]porcupine.Operation,
	init S,
	step func(s S, in I, out O) []S,
	describe func(in I, out O) string,
	describeState func(s S) string,
) porcupine.Model {
	seed := maphash.MakeSeed()
	m := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{init} },
		Step: func(state, input, output any) []any {
			next := step(state.(S), input.(I), output.(O))
			out := make([]any, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Equal:             func(a, b any) bool { return a.(S) == b.(S) },
		Hash:              func(s any) uint64 { return hashOf(seed, s.(S)) },
		DescribeOperation: func(in, out any) string { return describe(in.(I), out.(O)) },
		DescribeState:     func(s any) string { return describeState(s.(S)) },
	}
	return m.ToModel()
}

// byKey partitions a history by the key of each operation; an operation
// with an empty key (a Sweep, which concerns every key) goes into every
// partition.
func byKey(keyOf func(input any) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(history []porcupine.Operation) [][]porcupine.Operation {
		index := map[string]int{}
		var parts [][]porcupine.Operation
		var global []porcupine.Operation
		for _, op := range history {
			k := keyOf(op.Input)
			if k == "" {
				global = append(global, op)
				continue
			}
			i, ok := index[k]
			if !ok {
				i = len(parts)
				index[k] = i
				parts = append(parts, nil)
			}
			parts[i] = append(parts[i], op)
		}
		if len(parts) == 0 && len(global) > 0 {
			return [][]porcupine.Operation{global}
		}
		for i := range parts {
			parts[i] = append(parts[i], global...)
		}
		return parts
	}
}

func errorf(format string, args ...any) error { return fmt.Errorf("lincheck: "+format, args...) }
