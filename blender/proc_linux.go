package blender

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill Blender when the worker that started it dies, even by
// kill -9: an orphaned Blender would go on rendering a tile nobody owns.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
