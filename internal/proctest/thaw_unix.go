//go:build unix

package proctest

import "syscall"

// thaw continues a process a test stopped with SIGSTOP.
func (p *Proc) thaw() { p.Signal(syscall.SIGCONT) }
