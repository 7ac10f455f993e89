//go:build !linux && !windows

package blender

import (
	"os"
	"os/exec"
)

// prepareCommand hands the driver its request and reply pipes as fds 3 and 4. Where the kernel
// offers no parent-death signal (macOS, the BSDs), Blender exits when its request pipe closes,
// which happens once it is idle.
func prepareCommand(cmd *exec.Cmd, req, rep *os.File) (args []string, started func() (release func(), err error), err error) {
	cmd.ExtraFiles = []*os.File{req, rep}
	return []string{"3", "4"}, func() (func(), error) { return func() {}, nil }, nil
}
