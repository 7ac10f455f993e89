//go:build !linux

package proctest

import "os/exec"

// dieWithParent does nothing where the kernel offers no parent-death signal: Kill ends the
// process when the test does.
func dieWithParent(*exec.Cmd) {}
