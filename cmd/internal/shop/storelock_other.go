//go:build !unix

package shop

import "os"

// lockDir creates dir; on this platform it takes no lock, so two shopd
// processes must not be given one -nats-store.
func lockDir(dir string) (release func(), err error) {
	return func() {}, os.MkdirAll(dir, 0o750)
}
