//go:build !linux

package killsoak_test

import "os/exec"

func setDeathSignal(*exec.Cmd) {}
