// Package miniotest runs a real MinIO server for tests: the S3 store, the
// finalization protocol and the farm's storage-outage tests run against it
// rather than against a fake.
package miniotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
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

// MinIOModule is the MinIO version the project's test command installs.
const MinIOModule = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"

// readyTimeout bounds how long Start and Restart wait for the server.
const readyTimeout = 60 * time.Second

// Server is a real MinIO process on a free loopback port with a temporary data
// directory. Bucket names a bucket that exists once Start returns.
type Server struct {
	Endpoint  string // host:port
	AccessKey string
	SecretKey string
	Bucket    string

	binary  string
	dataDir string
	console string // console host:port
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{} // closed when cmd has exited
}

// Start launches MinIO and waits until it is ready. The binary is
// $TILEFARM_MINIO, else `minio` on PATH, else $(go env GOPATH)/bin/minio;
// a missing binary fails the test (it is never skipped). The process is killed
// and its data removed when the test ends; its log is printed if the test failed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := findBinary()
	if err != nil {
		t.Fatalf("miniotest: %v; run the test command from README.md, which installs it (go install %s)", err, MinIOModule)
	}
	tmp := t.TempDir() // removed after the process is killed (cleanups run last-in first-out)
	s := &Server{
		AccessKey: "tilefarm-" + randomHex(4),
		SecretKey: randomHex(20),
		Bucket:    "tilefarm-test",
		binary:    bin,
		dataDir:   filepath.Join(tmp, "data"),
		logPath:   filepath.Join(tmp, "minio.log"),
	}
	if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
		t.Fatalf("miniotest: %v", err)
	}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			s.dumpLog(t)
		}
	})
	// A free port can be taken by someone else before MinIO binds it: retry
	// with new ports when the process dies during startup.
	for try := 0; ; try++ {
		s.Endpoint, s.console = freeAddr(t), freeAddr(t)
		err := s.launch()
		if err == nil {
			err = s.waitReady()
		}
		if err == nil {
			return s
		}
		s.kill()
		if try == 2 || !errors.Is(err, errExited) {
			s.dumpLog(t)
			t.Fatalf("miniotest: starting %s: %v", bin, err)
		}
	}
}

// URL returns the store URL of the server's bucket, for finalize.OpenStore.
func (s *Server) URL() string { return "s3+http://" + s.Endpoint + "/" + s.Bucket }

// Env returns the credential variables OpenStore and child processes read.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}

// DataDir returns the server's data directory, which survives Stop.
func (s *Server) DataDir() string { return s.dataDir }

// Stop stops the process (SIGTERM, then SIGKILL after 10 s) and keeps the
// data directory, so Restart brings the same objects back: an outage.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	s.mu.Lock()
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
}

// Restart starts the server again on the same port and data directory and
// waits until it is ready.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop(t)
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.launch()
		if err == nil {
			err = s.waitReady()
		}
		if err == nil {
			return
		}
		s.kill()
		// The old socket may linger briefly; retry an early exit until the deadline.
		if !errors.Is(err, errExited) || time.Now().After(deadline) {
			s.dumpLog(t)
			t.Fatalf("miniotest: restarting on %s: %v", s.Endpoint, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var errExited = errors.New("minio exited during startup")

// launch starts the process, appending its output to the log file.
func (s *Server) launch() error {
	cmd := exec.Command(s.binary, "server", s.dataDir,
		"--address", s.Endpoint, "--console-address", s.console, "--quiet")
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=on",
	)
	done, err := proctest.Launch(cmd, s.logPath, "minio server on "+s.Endpoint)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// waitReady polls the readiness endpoint until it answers 200.
func (s *Server) waitReady() error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	client := &http.Client{Timeout: 2 * time.Second}
	url := "http://" + s.Endpoint + "/minio/health/ready"
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return errExited
		default:
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			// The health endpoint turns 200 before IAM is loaded, while signed
			// requests still fail with "Server not initialized": ready means
			// the bucket exists, created with the root credentials.
			if resp.StatusCode == http.StatusOK {
				if lastErr = s.ensureBucket(); lastErr == nil {
					return nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s (last error: %v)", readyTimeout, lastErr)
}

// ensureBucket creates s.Bucket unless it exists.
func (s *Server) ensureBucket() error {
	client, err := minio.New(s.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		MaxRetries: 1,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := client.BucketExists(ctx, s.Bucket)
	if err != nil || ok {
		return err
	}
	return client.MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{})
}

// kill ends the process at once, if it runs.
func (s *Server) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

func (s *Server) dumpLog(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		t.Logf("miniotest: no log: %v", err)
		return
	}
	t.Logf("miniotest: MinIO log %s:\n%s", s.logPath, strings.ReplaceAll(string(b), s.SecretKey, "REDACTED"))
}

// findBinary locates the minio executable.
func findBinary() (string, error) {
	if p := os.Getenv("TILEFARM_MINIO"); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("TILEFARM_MINIO=%s is not an executable file", p)
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
	return "", errors.New("minio binary not found ($TILEFARM_MINIO, PATH, $(go env GOPATH)/bin)")
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("miniotest: finding a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
