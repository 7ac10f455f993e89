package blender

import (
	"os"
	"os/exec"
	"syscall"
)

// prepareCommand hands the driver its request and reply pipes as fds 3 and 4 and has the kernel
// kill Blender when the worker that started it dies, even by kill -9: an orphaned Blender would
// go on rendering a tile nobody owns. It returns the driver's arguments naming the pipes, and a
// function to call once the process started, whose release is called once it has exited
// (nothing to do here).
func prepareCommand(cmd *exec.Cmd, req, rep *os.File) (args []string, started func() (release func(), err error), err error) {
	cmd.ExtraFiles = []*os.File{req, rep}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return []string{"3", "4"}, func() (func(), error) { return func() {}, nil }, nil
}
