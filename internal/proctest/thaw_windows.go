package proctest

// thaw does nothing on Windows, where no process is stopped by a signal.
func (p *Proc) thaw() {}
