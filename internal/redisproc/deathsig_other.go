//go:build !linux

package redisproc

import "os/exec"

func setDeathSignal(*exec.Cmd) {}
