// Package natstest runs real NATS servers for tests and the fault harness: nats-server
// processes, single or as a JetStream cluster, whose nodes can be killed, stopped and restarted
// (a coordinator that must die while workers go on, a stream leader killed mid-render), and
// an in-process JetStream server for unit tests.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/proctest"
)

// EnvBinary names the variable the test command sets to the nats-server it builds from the
// nats-server/v2 module pinned in go.mod.
const EnvBinary = "TILEFARM_NATS_SERVER"

// readyTimeout bounds how long a start or restart waits for a server.
const readyTimeout = 30 * time.Second

// Options configure the servers.
type Options struct {
	// Config is appended to every node's configuration (accounts, authorization, TLS).
	Config string
	// Connect are the options clients need to reach the servers (credentials, TLS); the
	// readiness check uses them.
	Connect []nats.Option
	// Hosts, when set, are the machines the nodes run on, one each (nettest hosts): a node
	// listens for clients on port 4222 and for routes on 6222 of its host's address, and the
	// readiness check dials it from inside its host.
	Hosts []Host
}

// Host is a machine a node runs on: a network namespace of nettest.
type Host interface {
	Command(name string, args ...string) *exec.Cmd
	HostPort(port int) string
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// hostDialer dials from inside a host, as nats.CustomDialer.
type hostDialer struct{ h Host }

func (d hostDialer) Dial(network, address string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return d.h.DialContext(ctx, network, address)
}

// Server is one nats-server process with JetStream, on a loopback port, with its store in a
// directory that survives Stop and Kill, so Restart brings its streams back.
type Server struct {
	Name string
	Addr string // host:port of the client listener

	binary  string
	conf    string
	logPath string
	connect []nats.Option
	cluster bool
	host    Host // nil: this machine

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{}
}

// Cluster is one server, or several forming a JetStream cluster.
type Cluster struct {
	Servers []*Server
}

// Launch starts n nats-server processes under dir: one plain server for n = 1, else a
// JetStream cluster of n routed nodes. It returns once every node serves clients and
// JetStream has a meta leader. The binary is $TILEFARM_NATS_SERVER, else nats-server on PATH.
func Launch(dir string, n int, o Options) (*Cluster, error) {
	bin, err := findBinary()
	if err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		c, err := launchOnce(bin, dir, n, o)
		if err == nil {
			return c, nil
		}
		c.Kill()
		// A free port can be taken by someone else before a node binds it: try new ports.
		if try == 2 || !errors.Is(err, errExited) {
			return c, err
		}
	}
}

func launchOnce(bin, dir string, n int, o Options) (*Cluster, error) {
	c := &Cluster{}
	if o.Hosts != nil && len(o.Hosts) != n {
		return c, fmt.Errorf("%d hosts for %d nodes", len(o.Hosts), n)
	}
	clientAddrs, routeAddrs := make([]string, n), make([]string, n)
	for i := range n {
		if o.Hosts != nil {
			clientAddrs[i], routeAddrs[i] = o.Hosts[i].HostPort(4222), o.Hosts[i].HostPort(6222)
			continue
		}
		var err error
		if clientAddrs[i], err = proctest.FreeAddr(); err != nil {
			return c, err
		}
		if routeAddrs[i], err = proctest.FreeAddr(); err != nil {
			return c, err
		}
	}
	var routes []string
	for _, a := range routeAddrs {
		routes = append(routes, fmt.Sprintf("%q", "nats-route://"+a))
	}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		ndir := filepath.Join(dir, name)
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			return c, err
		}
		conf := fmt.Sprintf("server_name: %s\nlisten: %q\njetstream {\n  store_dir: %q\n}\n", name, clientAddrs[i], filepath.Join(ndir, "js"))
		if n > 1 {
			conf += fmt.Sprintf("cluster {\n  name: tilefarm\n  listen: %q\n  routes: [%s]\n}\n", routeAddrs[i], strings.Join(routes, ", "))
		}
		conf += o.Config
		s := &Server{Name: name, Addr: clientAddrs[i], binary: bin, conf: filepath.Join(ndir, "server.conf"),
			logPath: filepath.Join(ndir, "server.log"), connect: o.Connect, cluster: n > 1}
		if o.Hosts != nil {
			s.host = o.Hosts[i]
			s.connect = append([]nats.Option{nats.SetCustomDialer(hostDialer{s.host})}, o.Connect...)
		}
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			return c, err
		}
		c.Servers = append(c.Servers, s)
	}
	for _, s := range c.Servers {
		if err := s.start(); err != nil {
			return c, fmt.Errorf("starting %s: %w", s.Name, err)
		}
	}
	for _, s := range c.Servers {
		if err := s.waitReady(); err != nil {
			return c, fmt.Errorf("waiting for %s: %w", s.Name, err)
		}
	}
	return c, nil
}

// Start launches a single nats-server with JetStream for a test. A missing binary fails the
// test (it is never skipped). The process is killed when the test ends; its log is printed if
// the test failed.
func Start(t testing.TB, opts ...Options) *Server { return StartCluster(t, 1, opts...).Servers[0] }

// StartCluster launches a JetStream cluster of n nodes for a test, as Start does one server.
func StartCluster(t testing.TB, n int, opts ...Options) *Cluster {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	c, err := Launch(t.TempDir(), n, o)
	if c != nil {
		t.Cleanup(func() {
			c.Kill()
			if t.Failed() {
				var b strings.Builder
				c.DumpLogs(&b)
				t.Logf("natstest: server logs:\n%s", b.String())
			}
		})
	}
	if err != nil {
		t.Fatalf("natstest: %v; run the test command from README.md, which builds nats-server", err)
	}
	return c
}

// URLs is every node's client URL, comma-separated, as clients take them.
func (c *Cluster) URLs() string {
	var urls []string
	for _, s := range c.Servers {
		urls = append(urls, s.URL())
	}
	return strings.Join(urls, ",")
}

// Server returns the node called name, or nil.
func (c *Cluster) Server(name string) *Server {
	for _, s := range c.Servers {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Kill kills every node.
func (c *Cluster) Kill() {
	for _, s := range c.Servers {
		s.Kill()
	}
}

// DumpLogs writes every node's log to w.
func (c *Cluster) DumpLogs(w io.Writer) {
	for _, s := range c.Servers {
		b, _ := os.ReadFile(s.logPath)
		fmt.Fprintf(w, "---- %s (%s) ----\n%s", s.Name, s.logPath, b)
	}
}

// URL is the server's client URL.
func (s *Server) URL() string { return "nats://" + s.Addr }

var errExited = errors.New("nats-server exited")

func (s *Server) start() error {
	cmd := exec.Command(s.binary, "-c", s.conf)
	if s.host != nil {
		cmd = s.host.Command(s.binary, "-c", s.conf)
	}
	done, err := proctest.Launch(cmd, s.logPath, "nats-server "+s.Name+" on "+s.Addr)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// waitReady waits until the server serves clients and, in a cluster, answers JetStream
// requests (the cluster has a meta leader and this node has caught up with it).
func (s *Server) waitReady() error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errExited
		default:
		}
		last = s.ping()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %v", readyTimeout, last)
}

func (s *Server) ping() error {
	nc, err := nats.Connect(s.URL(), append([]nats.Option{nats.Timeout(time.Second), nats.NoReconnect()}, s.connect...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	if !s.cluster {
		return nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// Pid is the server process's id, or 0 when it is not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the process is up.
func (s *Server) Running() bool { return s.Pid() != 0 }

// Kill kills the process with SIGKILL and waits for it to exit; its store stays.
func (s *Server) Kill() { s.signalAndWait(syscall.SIGKILL) }

// Stop stops the process with SIGTERM (a clean shutdown) and waits; its store stays.
func (s *Server) Stop() { s.signalAndWait(syscall.SIGTERM) }

func (s *Server) signalAndWait(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Relaunch starts a stopped or killed server again on the same address and store, and waits
// until it is ready.
func (s *Server) Relaunch() error {
	if err := s.start(); err != nil {
		return err
	}
	return s.waitReady()
}

// Restart is Relaunch for a test.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.Relaunch(); err != nil {
		b, _ := os.ReadFile(s.logPath)
		t.Fatalf("natstest: restarting %s: %v\n%s", s.Name, err, b)
	}
}

// StreamLeader returns the name of the node leading stream, as the cluster reports it.
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader", stream)
	}
	return info.Cluster.Leader, nil
}

// NewStreamLeader waits until stream has a leader other than old and returns its name. Each
// try has a timeout of its own: a request that reaches the node just killed, or a stream
// mid-election, gets no answer, and the client may still be reconnecting.
func (c *Cluster) NewStreamLeader(ctx context.Context, js jetstream.JetStream, stream, old string) (string, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		leader, err := c.StreamLeader(tctx, js, stream)
		cancel()
		if err == nil && leader != old {
			return leader, nil
		}
		if ctx.Err() != nil {
			return leader, fmt.Errorf("stream %s: no leader other than %s: %w (last: %v)", stream, old, ctx.Err(), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func findBinary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			return "", fmt.Errorf("%s=%q is not a file", EnvBinary, p)
		}
		return p, nil
	}
	if p := cacheBinary(); p != "" {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no nats-server: not at %s, where the test command builds it, nor on PATH; set %s", cacheBinary(), EnvBinary)
}

// cacheBinary is where the test command builds the nats-server of the version go.mod pins:
// under the user's cache directory (XDG_CACHE_HOME, else ~/.cache), as test.sh does. That is
// the version of the server module this package is built with (a release: v + its VERSION).
func cacheBinary() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "tilefarm", "nats-server-v"+server.VERSION, "nats-server")
}

// InProcess starts a real JetStream server inside the test process, with file storage in a
// temporary directory, and returns a connection to it and its client URL. It is the server
// every package's unit tests share; it is shut down when the test ends.
func InProcess(t testing.TB) (nc *nats.Conn, js jetstream.JetStream, url string) {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		ServerName: "natstest", Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true, DisableJetStreamBanner: true,
	})
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(readyTimeout) || !srv.JetStreamEnabled() {
		t.Fatalf("natstest: in-process JetStream server not ready after %v", readyTimeout)
	}
	nc, err = nats.Connect(srv.ClientURL(), nats.InProcessServer(srv), nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("natstest: connecting: %v", err)
	}
	t.Cleanup(nc.Close)
	if js, err = jetstream.New(nc); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return nc, js, srv.ClientURL()
}
