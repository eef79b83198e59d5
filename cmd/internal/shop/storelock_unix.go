//go:build unix

package shop

import (
	"errors"
	"os"
	"syscall"
)

// lockDir takes an exclusive lock on the file shopd.lock in dir (created
// if need be), held until release, or by the process until it exits:
// two NATS servers must never share a JetStream store. errDirLocked: another
// process holds it.
func lockDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(dir+string(os.PathSeparator)+"shopd.lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errDirLocked
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}
