package blender

// IdlePIDs lists the process ids of the pool's idle Blender processes, for tests that kill
// or freeze them.
func (p *Pool) IdlePIDs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for _, proc := range p.idle {
		pids = append(pids, proc.cmd.Process.Pid)
	}
	return pids
}
