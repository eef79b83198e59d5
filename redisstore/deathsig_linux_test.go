package redisstore_test

import (
	"os/exec"
	"syscall"
)

// setDeathSignal kills cmd if the test binary dies before TestMain stops it.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
