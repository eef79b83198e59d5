// Package exactlyonce holds the cross-store tests of idem's central
// promise: many OS processes, each with many goroutines, send the same
// keys through the HTTP middleware to a handler whose effect is a row in
// PostgreSQL, and every key's effect happens exactly once. The package has
// no code of its own; see its tests.
package exactlyonce
