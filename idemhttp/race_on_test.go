//go:build race

package idemhttp_test

// raceEnabled: the race detector makes sync.Pool drop items, so allocation counts do not hold.
const raceEnabled = true
