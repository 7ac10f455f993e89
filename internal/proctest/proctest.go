// Package proctest starts the real server processes tests run against (nats-server, MinIO),
// each with its output appended to a log file, and never lets one outlive the test binary.
package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Launch starts cmd with its output appended to logPath after a line naming banner and the
// time; done is closed once the process has exited. The process is killed if the test binary
// dies first.
func Launch(cmd *exec.Cmd, logPath, banner string) (done <-chan struct{}, err error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "=== %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), banner)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	ch := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(ch)
	}()
	return ch, nil
}
