// Package natstest runs real nats-server processes for tests: farms whose coordinator must be
// killed while workers keep going, and clusters whose nodes must be killed, need JetStream in
// a process of its own rather than embedded in the coordinator.
package natstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

// readyTimeout bounds how long Start and Restart wait for the server.
const readyTimeout = 30 * time.Second

// Server is one real nats-server process with JetStream, on a loopback port, with its store
// in a temporary directory that survives Stop and Kill, so Restart brings its streams back.
type Server struct {
	Name string
	Addr string // host:port of the client listener

	binary  string
	dir     string
	conf    string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{}
}

// Start launches a single nats-server with JetStream and waits until it serves clients. The
// binary is $TILEFARM_NATS_SERVER, else nats-server on PATH; a missing binary fails the test
// (it is never skipped). The process is killed when the test ends; its log is printed if the
// test failed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		t.Fatalf("natstest: %v; run the test command from README.md, which builds it", err)
	}
	dir := t.TempDir()
	s := &Server{Name: "n1", binary: bin, dir: dir, conf: filepath.Join(dir, "server.conf"), logPath: filepath.Join(dir, "server.log")}
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			s.dumpLog(t)
		}
	})
	for try := 0; ; try++ {
		s.Addr = freeAddr(t)
		conf := fmt.Sprintf("server_name: %s\nlisten: %q\njetstream {\n  store_dir: %q\n}\n", s.Name, s.Addr, filepath.Join(dir, "js"))
		if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
			t.Fatalf("natstest: %v", err)
		}
		err := s.launch()
		if err == nil {
			return s
		}
		s.Kill()
		if try == 2 || !errors.Is(err, errExited) {
			s.dumpLog(t)
			t.Fatalf("natstest: starting %s: %v", bin, err)
		}
	}
}

// URL is the server's client URL.
func (s *Server) URL() string { return "nats://" + s.Addr }

var errExited = errors.New("nats-server exited")

func (s *Server) launch() error {
	cmd := exec.Command(s.binary, "-c", s.conf)
	done, err := proctest.Launch(cmd, s.logPath, "nats-server "+s.Name+" on "+s.Addr)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errExited
		default:
		}
		nc, err := nats.Connect(s.URL(), nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v", readyTimeout)
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

// Restart starts the server again on the same address and store.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.launch(); err != nil {
		s.dumpLog(t)
		t.Fatalf("natstest: restarting %s: %v", s.Name, err)
	}
}

func (s *Server) dumpLog(t testing.TB) {
	b, _ := os.ReadFile(s.logPath)
	t.Logf("natstest: log of %s (%s):\n%s", s.Name, s.logPath, b)
}

func findBinary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			return "", fmt.Errorf("%s=%q is not a file", EnvBinary, p)
		}
		return p, nil
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no nats-server: set %s or put nats-server on PATH", EnvBinary)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
