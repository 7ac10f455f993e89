//go:build !linux

package blender

import "os/exec"

// setDeathSignal is a no-op where the kernel offers no parent-death signal: Blender then exits
// when its request pipe closes, which happens once it is idle.
func setDeathSignal(cmd *exec.Cmd) {}
