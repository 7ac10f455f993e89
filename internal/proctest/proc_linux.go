package proctest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the process when the test that started it dies.
func dieWithParent(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
