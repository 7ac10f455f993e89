package miniotest

// Deployment is a single server or a cluster behind one set of node operations, for the fault
// harness, which drives both the same way.
type Deployment struct {
	server  *Server
	cluster *Cluster
}

// LaunchDeployment starts a single server (nodes = 1) or a cluster of nodes under dir.
func LaunchDeployment(dir string, nodes int) (*Deployment, error) {
	if nodes == 1 {
		s, err := Launch(dir)
		if err != nil {
			if s != nil {
				s.Kill()
			}
			return nil, err
		}
		return &Deployment{server: s}, nil
	}
	c, err := LaunchCluster(dir, nodes)
	if err != nil {
		if c != nil {
			c.Kill()
		}
		return nil, err
	}
	return &Deployment{cluster: c}, nil
}

// URL is the store URL clients use (node 0's).
func (d *Deployment) URL() string {
	if d.server != nil {
		return d.server.URL()
	}
	return d.cluster.URL()
}

// Env is the credential variables clients need.
func (d *Deployment) Env() []string {
	if d.server != nil {
		return d.server.Env()
	}
	return d.cluster.Env()
}

// Nodes is the number of server processes.
func (d *Deployment) Nodes() int {
	if d.server != nil {
		return 1
	}
	return d.cluster.Len()
}

func (d *Deployment) proc(i int) *process {
	if d.server != nil {
		return d.server.proc
	}
	return d.cluster.Node(i).proc
}

// KillNode kills node i with SIGKILL; StopNode stops it with SIGTERM. Its data stays.
func (d *Deployment) KillNode(i int) { d.proc(i).kill() }

// StopNode stops node i with SIGTERM.
func (d *Deployment) StopNode(i int) { d.proc(i).stop() }

// RelaunchNode starts node i again and waits until it serves.
func (d *Deployment) RelaunchNode(i int) error {
	if d.server != nil {
		return d.server.Relaunch()
	}
	return d.cluster.Node(i).Relaunch()
}

// Kill kills every node.
func (d *Deployment) Kill() {
	if d.server != nil {
		d.server.Kill()
		return
	}
	d.cluster.Kill()
}
