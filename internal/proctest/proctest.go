// Package proctest starts the real processes tests and benchmarks run against (nats-server,
// MinIO, the farm's own commands), each with its output appended to a log file, and never lets
// one outlive the test binary. Proc is the one handle on such a process the e2e tests, the
// chaos harness and farmbench share; internal/farmtest builds and starts whole farms of them.
package proctest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Launch starts cmd with its output appended to logPath after a line naming banner and the
// time; done is closed once the process has exited. The process is killed if the test binary
// dies first.
func Launch(cmd *exec.Cmd, logPath, banner string) (done <-chan struct{}, err error) {
	done, _, err = launch(cmd, logPath, banner)
	return done, err
}

// launch is Launch that also returns the log file's size after the banner: where the
// process's own output starts.
func launch(cmd *exec.Cmd, logPath, banner string) (done <-chan struct{}, start int64, err error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, 0, err
	}
	fmt.Fprintf(logf, "=== %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), banner)
	if start, err = logf.Seek(0, io.SeekCurrent); err != nil {
		logf.Close()
		return nil, 0, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, 0, err
	}
	ch := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(ch)
	}()
	return ch, start, nil
}

// ModuleRoot is the directory of the tilefarm module, where the examples are.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// handedOut holds the addresses FreeAddr returned in this process: the kernel may offer a
// port again once its listener closed, and two of a farm's listeners given the same port
// (its HTTP and its NATS, say) make the later one fail to bind.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// FreeAddr returns a loopback address whose port was free a moment ago and that it has not
// returned before in this process.
func FreeAddr() (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("finding a free port: %w", err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr, nil
		}
	}
	return "", errors.New("finding a free port: the kernel offered only ports handed out before")
}
