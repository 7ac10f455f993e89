// Package farmtest runs farms of real processes, the one harness of the e2e tests, the chaos
// harness and farmbench: the farm's binaries built once (Build), `coordinator serve` on its
// embedded NATS or an external one (natstest), on its file store or MinIO (miniotest), and
// tileworkers, each with its log in a file of the farm's directory, started, killed and started
// again, the coordinator waited for until it answers /healthz. It returns errors rather than
// failing a test, so the chaos command and farmbench use it as the tests do; every process is
// a proctest.Proc, which waits for a log line.
package farmtest

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tilefarm/tilefarm/internal/proctest"
)

// TextLogs makes a farm process log key=value lines, the form the tests, the scenarios and the
// measurements read.
const TextLogs = "TILEFARM_LOG_FORMAT=text"

// healthPoll is how often a start of the coordinator asks /healthz again.
const healthPoll = 50 * time.Millisecond

// Farm is one farm of real processes: a `coordinator serve` and tileworkers on one NATS and one
// object store, each process's log in a file of Dir numbered in the order the farm started
// them, so the directory reads as the run went. Its zero fields make the plain farm: the
// coordinator's embedded NATS and file store, on free loopback ports. Close kills what it
// started.
type Farm struct {
	Bins Binaries
	Dir  string // the processes' logs, and the workers' checkpoint directories by default
	// Env is every process's environment beyond this one's and TextLogs: the store's
	// credentials, an API token.
	Env []string

	Data  string // the coordinator's --data; empty: Dir/coordinator
	Store string // every process's --store; empty: the coordinator's file store under Data
	// NATS is the URLs of an external NATS (natstest) the farm runs on instead of the
	// coordinator's embedded server, so the coordinator can die while the workers go on.
	NATS string
	// HTTP is the coordinator's API address and NATSListen its embedded server's: when empty,
	// each is a free loopback port picked at the coordinator's first start and kept across
	// restarts, so clients and workers find it again.
	HTTP, NATSListen string
	LogLevel         string   // the coordinator's --log-level; empty: debug
	ServeArgs        []string // flags of every start of the coordinator
	// HealthTimeout is how long a start of the coordinator waits for /healthz; 0 is a minute.
	HealthTimeout time.Duration

	// CoordHost is the host the coordinator (and its embedded NATS) runs on, a network
	// namespace of nettest; nil is this machine. Its health is probed from there.
	CoordHost Host

	Coord   *proctest.Proc // the coordinator started last
	Workers []*Worker      // every worker started, in order

	started int      // processes started, numbering their logs
	servers []func() // kill the servers UseNATS and UseMinIO were given
}

// Worker is a tileworker of a farm.
type Worker struct {
	*proctest.Proc
	Metrics string // its /metrics address, when WorkerSpec.Metrics asked for one
}

// WorkerSpec is how a tileworker of a farm starts.
type WorkerSpec struct {
	Name string
	// Checkpoints is its --checkpoints directory; empty: Dir/ckpt-Name, where a worker started
	// again under the same name finds its local checkpoints.
	Checkpoints string
	Concurrency int      // --concurrency; 0 is 1
	Metrics     bool     // serve /metrics on a free loopback port (Worker.Metrics)
	Args        []string // further flags, after the farm's, so they override them
	Host        Host     // the host it runs on (a nettest namespace); nil is this machine
}

// Host is a machine a farm process runs on: a network namespace of nettest, whose commands
// run inside it and whose HTTP client connects from inside it.
type Host interface {
	Command(name string, args ...string) *exec.Cmd
	HTTPClient() *http.Client
}

// NATS is a NATS server or cluster (natstest) a farm runs on.
type NATS interface {
	URLs() string
	Kill()
}

// MinIO is a MinIO server, cluster or deployment (miniotest) a farm keeps its objects in.
type MinIO interface {
	URL() string
	Env() []string
	Kill()
}

// UseNATS makes n the farm's NATS instead of the coordinator's embedded server; Close kills it.
func (f *Farm) UseNATS(n NATS) {
	f.NATS = n.URLs()
	f.servers = append(f.servers, n.Kill)
}

// UseMinIO makes m the farm's object store: its URL is every process's --store, its
// credentials join Env, and Close kills it.
func (f *Farm) UseMinIO(m MinIO) {
	f.Store = m.URL()
	f.Env = append(f.Env, m.Env()...)
	f.servers = append(f.servers, m.Kill)
}

func (f *Farm) data() string { return cmp.Or(f.Data, filepath.Join(f.Dir, "coordinator")) }

// NATSURL is the URL workers and clients reach the farm's NATS at.
func (f *Farm) NATSURL() string {
	if f.NATS != "" {
		return f.NATS
	}
	return "nats://" + f.NATSListen
}

// StoreURL is the farm's object store: Store, or the coordinator's file store.
func (f *Farm) StoreURL() string {
	if f.Store != "" {
		return f.Store
	}
	return "file://" + filepath.Join(f.data(), "store")
}

// StartCoordinator starts `coordinator serve` with the farm's flags and then extra (a fault
// seam, say), after killing the coordinator started before if it still runs, and waits until
// it answers /healthz. One that exits first or is not healthy in time is killed, and the
// error holds its log.
func (f *Farm) StartCoordinator(ctx context.Context, extra ...string) error {
	if f.Coord != nil {
		f.Coord.Kill()
	}
	var err error
	if f.HTTP == "" {
		if f.HTTP, err = proctest.FreeAddr(); err != nil {
			return err
		}
	}
	natsArgs := []string{"--nats", f.NATS}
	if f.NATS == "" {
		if f.NATSListen == "" {
			if f.NATSListen, err = proctest.FreeAddr(); err != nil {
				return err
			}
		}
		natsArgs = []string{"--nats-listen", f.NATSListen}
	}
	args := append([]string{"serve", "--data", f.data(), "--listen", f.HTTP}, natsArgs...)
	if f.Store != "" {
		args = append(args, "--store", f.Store)
	}
	args = append(append(append(args, "--log-level", cmp.Or(f.LogLevel, "debug")), f.ServeArgs...), extra...)
	p, err := f.start("coordinator", f.CoordHost, f.Bins.Coordinator, args)
	if err != nil {
		return err
	}
	f.Coord = p
	client := http.DefaultClient
	if f.CoordHost != nil {
		client = f.CoordHost.HTTPClient()
	}
	if err := waitHealthy(ctx, client, f.HTTP, p, cmp.Or(f.HealthTimeout, time.Minute)); err != nil {
		p.Kill()
		return err
	}
	return nil
}

// waitHealthy polls the coordinator p's /healthz at addr with client until it answers 200,
// for up to d.
func waitHealthy(ctx context.Context, client *http.Client, addr string, p *proctest.Proc, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.Exited() {
			return fmt.Errorf("coordinator serve exited before it was healthy:\n%s", p.Log())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("coordinator serve not healthy within %v:\n%s", d, p.Log())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for coordinator serve to be healthy: %w", ctx.Err())
		case <-p.Done():
		case <-time.After(healthPoll):
		}
	}
}

// StartWorker starts a tileworker on the farm's NATS and store, logging at debug, and adds it
// to Workers. The coordinator must have started once, for its address.
func (f *Farm) StartWorker(w WorkerSpec) (*Worker, error) {
	ckpt := cmp.Or(w.Checkpoints, filepath.Join(f.Dir, "ckpt-"+w.Name))
	args := []string{"--nats", f.NATSURL(), "--store", f.StoreURL(), "--checkpoints", ckpt, "--name", w.Name,
		"--concurrency", strconv.Itoa(max(w.Concurrency, 1))}
	wk := &Worker{}
	if w.Metrics {
		addr, err := proctest.FreeAddr()
		if err != nil {
			return nil, err
		}
		wk.Metrics = addr
		args = append(args, "--metrics-listen", addr)
	}
	args = append(append(args, "--log-level", "debug"), w.Args...)
	p, err := f.start(w.Name, w.Host, f.Bins.Tileworker, args)
	if err != nil {
		return nil, err
	}
	wk.Proc = p
	f.Workers = append(f.Workers, wk)
	return wk, nil
}

// start starts a farm process on host (nil: this machine) with its log numbered in Dir.
func (f *Farm) start(name string, host Host, bin string, args []string) (*proctest.Proc, error) {
	if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	f.started++
	logPath := filepath.Join(f.Dir, fmt.Sprintf("%02d-%s.log", f.started, name))
	cmd := exec.Command(bin, args...)
	if host != nil {
		cmd = host.Command(bin, args...)
	}
	return proctest.StartCmd(name, cmd, logPath, append([]string{TextLogs}, f.Env...))
}

// Close kills the farm's processes, then the servers UseNATS and UseMinIO were given.
func (f *Farm) Close() {
	if f.Coord != nil {
		f.Coord.Kill()
	}
	for _, w := range f.Workers {
		w.Kill()
	}
	for _, kill := range f.servers {
		kill()
	}
}
