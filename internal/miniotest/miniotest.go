// Package miniotest runs a real MinIO server for tests: the S3 store, the
// finalization protocol and the farm's storage-outage tests run against it
// rather than against a fake. Start runs a single node; StartCluster runs a
// distributed, erasure-coded deployment of several nodes whose nodes a test
// can kill and restart one at a time.
package miniotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/tilefarm/tilefarm/internal/proctest"
)

// MinIOVersion is the MinIO version the project's test command installs (test.sh's
// MINIO_VERSION), into the cache directory cacheBinary names; MinIOModule is its module.
const (
	MinIOVersion = "v0.0.0-20260212201848-7aac2a2c5b7c"
	MinIOModule  = "github.com/minio/minio@" + MinIOVersion
)

// cacheBinary is where the test command installs the MinIO of MinIOVersion: under the user's
// cache directory (XDG_CACHE_HOME, else ~/.cache), as test.sh does.
func cacheBinary() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "tilefarm", "minio-"+MinIOVersion, "minio")
}

// readyTimeout bounds how long Start, StartCluster and Restart wait for the servers.
const readyTimeout = 60 * time.Second

// startTries is how many sets of free ports Start and StartCluster try: a free
// port can be taken by someone else before MinIO binds it.
const startTries = 3

// Server is a real MinIO process on a free loopback port with a temporary data
// directory. Bucket names a bucket that exists once Start returns.
type Server struct {
	Endpoint  string // host:port
	AccessKey string
	SecretKey string
	Bucket    string

	dataDir string
	proc    *process
}

// Start launches MinIO and waits until it is ready. The binary is
// $TILEFARM_MINIO, else `minio` on PATH, else $(go env GOPATH)/bin/minio;
// a missing binary fails the test (it is never skipped). The process is killed
// and its data removed when the test ends; its log is printed if the test failed.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := Launch(t.TempDir())
	if s != nil {
		t.Cleanup(func() {
			s.proc.kill()
			if t.Failed() {
				s.proc.dumpLog(t)
			}
		})
	}
	if err != nil {
		t.Fatalf("miniotest: %v", err)
	}
	return s
}

// Launch is Start outside a test: data and log go under dir, and the caller kills the server
// (Kill) when done.
func Launch(dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	s := &Server{
		AccessKey: "tilefarm-" + randomHex(4),
		SecretKey: randomHex(20),
		Bucket:    "tilefarm-test",
		dataDir:   filepath.Join(dir, "data"),
	}
	s.proc = newProcess(bin, filepath.Join(dir, "minio.log"), s.AccessKey, s.SecretKey)
	s.proc.volumes = []string{s.dataDir}
	if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
		return nil, err
	}
	for try := 1; ; try++ {
		if s.proc.addr, err = proctest.FreeAddr(); err != nil {
			return s, err
		}
		if s.proc.console, err = proctest.FreeAddr(); err != nil {
			return s, err
		}
		s.Endpoint = s.proc.addr
		err := s.proc.launch()
		if err == nil {
			err = s.waitReady()
		}
		if err == nil {
			return s, nil
		}
		s.proc.kill()
		if try == startTries || !errors.Is(err, errExited) {
			return s, fmt.Errorf("starting %s: %w", bin, err)
		}
	}
}

// Kill kills the server with SIGKILL; its data stays.
func (s *Server) Kill() { s.proc.kill() }

// URL returns the store URL of the server's bucket, for objstore.OpenStore.
func (s *Server) URL() string { return storeURL(s.Endpoint, s.Bucket) }

// Env returns the credential variables OpenStore and child processes read.
func (s *Server) Env() []string { return credentialEnv(s.AccessKey, s.SecretKey) }

// Pid is the server process's id, 0 when it is not running: benchmarks read its CPU time.
func (s *Server) Pid() int { return s.proc.pid() }

// DataDir returns the server's data directory, which survives Stop.
func (s *Server) DataDir() string { return s.dataDir }

// Stop stops the process (SIGTERM, then SIGKILL after 10 s) and keeps the
// data directory, so Restart brings the same objects back: an outage.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.proc.stop()
}

// Restart starts the server again on the same port and data directory and
// waits until it is ready.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.Relaunch(); err != nil {
		t.Fatalf("miniotest: %v", err)
	}
}

// Relaunch is Restart outside a test.
func (s *Server) Relaunch() error {
	if err := s.proc.restart(s.waitReady); err != nil {
		return fmt.Errorf("restarting on %s: %w", s.Endpoint, err)
	}
	return nil
}

// waitReady polls the readiness endpoint until it answers 200 and the bucket exists.
func (s *Server) waitReady() error {
	return pollReady([]*process{s.proc}, func() error {
		// The health endpoint turns 200 before IAM is loaded, while signed
		// requests still fail with "Server not initialized": ready means
		// the bucket exists, created with the root credentials.
		if err := healthy(s.Endpoint, "/minio/health/ready"); err != nil {
			return err
		}
		return ensureBucket(s.Endpoint, s.AccessKey, s.SecretKey, s.Bucket)
	})
}

var errExited = errors.New("minio exited during startup")

// process is one MinIO server process, a single-node Server or a node of a
// Cluster: how it is launched, stopped, killed and its log shown.
type process struct {
	binary  string
	logPath string
	secret  string   // redacted from the log when it is shown
	env     []string // added to the test's environment
	addr    string   // host:port of the S3 API
	console string   // host:port of the console, which is off but needs a port
	volumes []string // the data directory, or every node's endpoint URL

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{} // closed when cmd has exited
}

func newProcess(binary, logPath, accessKey, secretKey string) *process {
	return &process{
		binary:  binary,
		logPath: logPath,
		secret:  secretKey,
		env: []string{
			"MINIO_ROOT_USER=" + accessKey,
			"MINIO_ROOT_PASSWORD=" + secretKey,
			"MINIO_BROWSER=off",
			"MINIO_UPDATE=off",
			"MINIO_CI_CD=on",
			// Its request counters readable without a token: the benchmarks count the
			// requests of a tile (farmbench.MinIORequests).
			"MINIO_PROMETHEUS_AUTH_TYPE=public",
		},
	}
}

// launch starts the process, appending its output to the log file.
func (p *process) launch() error {
	args := append([]string{"server", "--address", p.addr, "--console-address", p.console, "--quiet"}, p.volumes...)
	cmd := exec.Command(p.binary, args...)
	cmd.Env = append(os.Environ(), p.env...)
	done, err := proctest.Launch(cmd, p.logPath, "minio server on "+p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return nil
}

// exited returns a channel closed once the process has exited, or nil if it
// was not started.
func (p *process) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func (p *process) pid() int {
	if !p.running() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether the process was launched and has not exited.
func (p *process) running() bool {
	done := p.exited()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// stop ends the process with SIGTERM, then SIGKILL after 10 s, and waits for it.
func (p *process) stop() { p.end(syscall.SIGTERM, 10*time.Second) }

// kill ends the process at once with SIGKILL, if it runs, and waits for it.
func (p *process) kill() { p.end(syscall.SIGKILL, 0) }

func (p *process) end(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			_ = cmd.Process.Kill()
		}
	}
	<-done
}

// restart stops the process and launches it again on the same addresses and
// volumes until ready succeeds. An early exit (the old socket may linger
// briefly) is retried until readyTimeout.
func (p *process) restart(ready func() error) error {
	p.stop()
	deadline := time.Now().Add(readyTimeout)
	for {
		err := p.launch()
		if err == nil {
			err = ready()
		}
		if err == nil {
			return nil
		}
		p.kill()
		if !errors.Is(err, errExited) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (p *process) dumpLog(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		t.Logf("miniotest: no log: %v", err)
		return
	}
	t.Logf("miniotest: MinIO log %s:\n%s", p.logPath, strings.ReplaceAll(string(b), p.secret, "REDACTED"))
}

// pollReady calls check until it succeeds, for at most readyTimeout; it
// returns errExited as soon as one of procs has exited.
func pollReady(procs []*process, check func() error) error {
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		for _, p := range procs {
			if !p.running() {
				return fmt.Errorf("%w: %s", errExited, p.addr)
			}
		}
		if lastErr = check(); lastErr == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s (last error: %v)", readyTimeout, lastErr)
}

var healthClient = &http.Client{Timeout: 2 * time.Second}

// healthy asks a health endpoint (path with its query) of the server at
// endpoint and fails unless it answers 200.
func healthy(endpoint, path string) error {
	resp, err := healthClient.Get("http://" + endpoint + path)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s%s: %s", endpoint, path, resp.Status)
	}
	return nil
}

// client returns a MinIO client with the root credentials that gives up fast.
func client(endpoint, accessKey, secretKey string) (*minio.Client, error) {
	return minio.New(endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(accessKey, secretKey, ""),
		MaxRetries: 1,
	})
}

// ensureBucket creates bucket unless it exists.
func ensureBucket(endpoint, accessKey, secretKey, bucket string) error {
	c, err := client(endpoint, accessKey, secretKey)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := c.BucketExists(ctx, bucket)
	if err != nil || ok {
		return err
	}
	return c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{})
}

func storeURL(endpoint, bucket string) string { return "s3+http://" + endpoint + "/" + bucket }

func credentialEnv(accessKey, secretKey string) []string {
	return []string{"AWS_ACCESS_KEY_ID=" + accessKey, "AWS_SECRET_ACCESS_KEY=" + secretKey}
}

// Binary is the MinIO executable Start runs, for a test that starts MinIO its own way (on a
// host of its own); a missing one is an error that says how to install it.
func Binary() (string, error) {
	bin, err := findBinary()
	if err != nil {
		return "", fmt.Errorf("%v; run the test command from README.md, which installs it (go install %s)", err, MinIOModule)
	}
	return bin, nil
}

// findBinary locates the minio executable.
func findBinary() (string, error) {
	if p := os.Getenv("TILEFARM_MINIO"); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("TILEFARM_MINIO=%s is not an executable file", p)
	}
	if p := cacheBinary(); p != "" && isExecutable(p) {
		return p, nil
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		out, err := exec.Command("go", "env", "GOPATH").Output()
		if err == nil {
			gopath = strings.TrimSpace(string(out))
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		if p := filepath.Join(dir, "bin", "minio"); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("minio binary not found ($TILEFARM_MINIO, %s, PATH, $(go env GOPATH)/bin)", cacheBinary())
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
