package miniotest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/tilefarm/tilefarm/internal/proctest"
)

// probeBucket holds the objects written to prove write quorum, so that they
// never show up in a cluster's Bucket.
const probeBucket = "miniotest-probe"

// Cluster is a distributed, erasure-coded MinIO deployment of separate server
// processes on loopback, each node with its own free port and data directory
// (one drive per node). Clients go to node 0 (Endpoint, URL), so tests kill and
// restart the other nodes. Bucket names a bucket that exists once StartCluster
// returns.
type Cluster struct {
	Endpoint  string // host:port of node 0
	AccessKey string
	SecretKey string
	Bucket    string

	nodes []*Node
}

// Node is one server process of a Cluster. Its port and data directory stay
// the same across Kill, Stop and Restart.
type Node struct {
	Endpoint string // host:port

	c       *Cluster
	dataDir string
	proc    *process
}

// StartCluster launches a distributed MinIO of nodes server processes, each
// started with the endpoint list of all of them, and waits until every node
// serves with write quorum and sees every other node's drive online, so that
// any one node can be killed at once. The binary is found as for Start, and a
// missing binary fails the test. The processes are killed and their data
// removed when the test ends; their logs are printed if the test failed.
//
// MinIO's default erasure coding keeps write quorum with one node down from
// three nodes on (four nodes: EC:2, write quorum 3, read quorum 2).
func StartCluster(t testing.TB, nodes int) *Cluster {
	t.Helper()
	c, err := LaunchCluster(t.TempDir(), nodes)
	if c != nil {
		t.Cleanup(func() {
			c.Kill()
			if t.Failed() {
				for _, n := range c.nodes {
					n.proc.dumpLog(t)
				}
			}
		})
	}
	if err != nil {
		t.Fatalf("miniotest: %v", err)
	}
	return c
}

// LaunchCluster is StartCluster outside a test: the nodes' data and logs go under dir, and
// the caller kills the cluster (Kill) when done.
func LaunchCluster(dir string, nodes int) (*Cluster, error) {
	bin, err := findBinary()
	if err != nil {
		return nil, fmt.Errorf("%v; run the test command from README.md, which installs it (go install %s)", err, MinIOModule)
	}
	if nodes < 3 {
		return nil, fmt.Errorf("a distributed MinIO of %d nodes: fewer than 3 lose write quorum with any node down", nodes)
	}
	c := &Cluster{
		AccessKey: "tilefarm-" + randomHex(4),
		SecretKey: randomHex(20),
		Bucket:    "tilefarm-test",
	}
	for i := range nodes {
		ndir := filepath.Join(dir, fmt.Sprintf("node%d", i))
		n := &Node{c: c, dataDir: filepath.Join(ndir, "data")}
		n.proc = newProcess(bin, filepath.Join(dir, fmt.Sprintf("minio-node%d.log", i)), c.AccessKey, c.SecretKey)
		c.nodes = append(c.nodes, n)
	}
	for try := 1; ; try++ {
		err := c.launch()
		if err == nil {
			err = c.waitReady()
		}
		if err == nil {
			return c, nil
		}
		c.Kill()
		if try == startTries || !errors.Is(err, errExited) {
			return c, fmt.Errorf("starting a %d-node MinIO cluster with %s: %w", nodes, bin, err)
		}
	}
}

// Kill kills every node.
func (c *Cluster) Kill() {
	for _, n := range c.nodes {
		n.proc.kill()
	}
}

// launch picks free ports and fresh data directories for every node and starts
// them all with the same endpoint list.
func (c *Cluster) launch() error {
	addrs, err := distinctFreeAddrs(2 * len(c.nodes))
	if err != nil {
		return err
	}
	var volumes []string
	for i, n := range c.nodes {
		if err := os.RemoveAll(n.dataDir); err != nil {
			return err
		}
		if err := os.MkdirAll(n.dataDir, 0o755); err != nil {
			return err
		}
		n.Endpoint = addrs[2*i]
		n.proc.addr, n.proc.console = addrs[2*i], addrs[2*i+1]
		// The paths differ between nodes: MinIO refuses one path served on two ports.
		volumes = append(volumes, "http://"+n.Endpoint+n.dataDir)
	}
	c.Endpoint = c.nodes[0].Endpoint
	for _, n := range c.nodes {
		n.proc.volumes = volumes
		// MinIO tells a node's own drive from its peers' by resolving each
		// endpoint's host and comparing its port with --address. In a container
		// (it looks for /.dockerenv) it refuses hosts that resolve to loopback
		// and waits for them forever, unless the node's own host:port is named
		// here; elsewhere the variable is ignored.
		n.proc.env = append(withoutLocalEnv(n.proc.env), "_MINIO_SERVER_LOCAL="+n.Endpoint)
	}
	for _, n := range c.nodes {
		if err := n.proc.launch(); err != nil {
			return err
		}
	}
	return nil
}

// waitReady waits until every node serves with write quorum and can lose any
// one node, then creates the bucket and writes through node 0.
func (c *Cluster) waitReady() error {
	return pollReady(c.procs(), func() error {
		for _, n := range c.nodes {
			if err := healthy(n.Endpoint, "/minio/health/cluster"); err != nil {
				return err
			}
		}
		if err := c.redundant(); err != nil {
			return err
		}
		for _, b := range []string{c.Bucket, probeBucket} {
			if err := ensureBucket(c.Endpoint, c.AccessKey, c.SecretKey, b); err != nil {
				return err
			}
		}
		return c.quorumWrite(c.Endpoint)
	})
}

// redundant fails unless every node would keep write quorum without itself:
// each sees every other node's drive online, so any one node may go down.
func (c *Cluster) redundant() error {
	for _, n := range c.nodes {
		if err := healthy(n.Endpoint, "/minio/health/cluster?maintenance=true"); err != nil {
			return err
		}
	}
	return nil
}

// quorumWrite writes and deletes an object through the node at endpoint; it
// succeeds only with write quorum.
func (c *Cluster) quorumWrite(endpoint string) error {
	cl, err := client(endpoint, c.AccessKey, c.SecretKey)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := "probe-" + randomHex(8)
	body := "write quorum"
	if _, err := cl.PutObject(ctx, probeBucket, key, strings.NewReader(body), int64(len(body)),
		minio.PutObjectOptions{DisableMultipart: true}); err != nil {
		return err
	}
	return cl.RemoveObject(ctx, probeBucket, key, minio.RemoveObjectOptions{})
}

func (c *Cluster) procs() []*process {
	var ps []*process
	for _, n := range c.nodes {
		ps = append(ps, n.proc)
	}
	return ps
}

// Node returns node i, 0 <= i < Len().
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// Len returns the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

// URL returns the store URL of the cluster's bucket on node 0, for objstore.OpenStore.
func (c *Cluster) URL() string { return storeURL(c.Endpoint, c.Bucket) }

// Env returns the credential variables OpenStore and child processes read;
// every node has the same root credentials.
func (c *Cluster) Env() []string { return credentialEnv(c.AccessKey, c.SecretKey) }

// URL returns the store URL of the cluster's bucket on this node.
func (n *Node) URL() string { return storeURL(n.Endpoint, n.c.Bucket) }

// DataDir returns the node's data directory (its one drive), which survives
// Kill and Stop.
func (n *Node) DataDir() string { return n.dataDir }

// Running reports whether the node's process runs.
func (n *Node) Running() bool { return n.proc.running() }

// Kill ends the node with SIGKILL, a crash, and waits until it is gone.
func (n *Node) Kill() { n.proc.kill() }

// Stop ends the node with SIGTERM (SIGKILL after 10 s) and waits until it is gone.
func (n *Node) Stop() { n.proc.stop() }

// Restart starts the node again (stopping it first if it runs) on the same
// port and data directory, and waits until it serves with write quorum, a
// write through it succeeds and, if every node runs, every node sees every
// drive online again, so that the next Kill keeps write quorum.
func (n *Node) Restart(t testing.TB) {
	t.Helper()
	if err := n.Relaunch(); err != nil {
		t.Fatalf("miniotest: %v", err)
	}
}

// Relaunch is Restart outside a test.
func (n *Node) Relaunch() error {
	c := n.c
	err := n.proc.restart(func() error {
		return pollReady([]*process{n.proc}, func() error {
			if err := healthy(n.Endpoint, "/minio/health/cluster"); err != nil {
				return err
			}
			if c.allRunning() {
				if err := c.redundant(); err != nil {
					return err
				}
			}
			return c.quorumWrite(n.Endpoint)
		})
	})
	if err != nil {
		return fmt.Errorf("restarting cluster node %s: %w", n.Endpoint, err)
	}
	return nil
}

func (c *Cluster) allRunning() bool {
	for _, n := range c.nodes {
		if !n.proc.running() {
			return false
		}
	}
	return true
}

// withoutLocalEnv drops a _MINIO_SERVER_LOCAL of an earlier start attempt.
func withoutLocalEnv(env []string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, "_MINIO_SERVER_LOCAL=") {
			out = append(out, e)
		}
	}
	return out
}

// distinctFreeAddrs returns n loopback addresses with distinct ports that were
// free a moment ago.
func distinctFreeAddrs(n int) ([]string, error) {
	seen := map[string]bool{}
	var addrs []string
	for len(addrs) < n {
		a, err := proctest.FreeAddr()
		if err != nil {
			return nil, err
		}
		if !seen[a] {
			seen[a] = true
			addrs = append(addrs, a)
		}
	}
	return addrs, nil
}
