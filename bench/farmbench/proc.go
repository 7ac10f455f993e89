package farmbench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Binaries are the farm's two commands (proctest.Build).
type Binaries = proctest.Binaries

// Proc is one farm process (proctest.Proc), so measurements can read what it logged and its
// CPU and memory from /proc while it lives.
type Proc = proctest.Proc

// textLogs makes a farm process log key=value lines, the form the measurements read.
const textLogs = "TILEFARM_LOG_FORMAT=text"

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every Linux this runs on.
const clockTicks = 100

// CPUTime reads a live process's user+system CPU time from /proc/PID/stat.
func CPUTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading cpu time: %w", err)
	}
	// The command name may hold spaces: the fields start after its closing parenthesis.
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, errors.New("short /proc stat line")
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime (fields 14 and 15 of the line)
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing cpu time: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// PeakRSS reads a process's peak resident set (VmHWM) in bytes from /proc.
func PeakRSS(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading peak rss: %w", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// WaitHealthy polls a coordinator's /healthz until it answers 200.
func WaitHealthy(ctx context.Context, addr string, p *Proc) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p != nil && p.Exited() {
			return fmt.Errorf("coordinator exited:\n%s", p.Log())
		}
		if !queue.Sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	return errors.New("coordinator did not become healthy")
}

// Coordinator is a `coordinator serve` process with its data in a directory.
type Coordinator struct {
	*Proc
	Data, HTTP, NATS string
}

// StartCoordinator starts `coordinator serve` (embedded JetStream on a free port) with its data
// under dir and its log in dir/serve.log, and waits until it is healthy.
func StartCoordinator(ctx context.Context, bin, dir string, env []string, extra ...string) (*Coordinator, error) {
	httpAddr, err := proctest.FreeAddr()
	if err != nil {
		return nil, err
	}
	natsAddr, err := proctest.FreeAddr()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Coordinator{Data: filepath.Join(dir, "data"), HTTP: httpAddr, NATS: natsAddr}
	args := append([]string{"serve", "--data", c.Data, "--listen", httpAddr, "--nats-listen", natsAddr, "--log-level", "warn"}, extra...)
	if c.Proc, err = proctest.Start("coordinator", bin, filepath.Join(dir, "serve.log"), append([]string{textLogs}, env...), args...); err != nil {
		return nil, err
	}
	if err := WaitHealthy(ctx, httpAddr, c.Proc); err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}
