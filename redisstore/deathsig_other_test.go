//go:build !linux

package redisstore_test

import "os/exec"

func setDeathSignal(*exec.Cmd) {}
