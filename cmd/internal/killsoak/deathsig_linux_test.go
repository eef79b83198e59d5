package killsoak_test

import (
	"os/exec"
	"syscall"
)

// setDeathSignal kills cmd if the test binary dies before it kills cmd.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
