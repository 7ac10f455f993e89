package farmbench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Binaries are the farm's two commands (proctest.Build).
type Binaries = proctest.Binaries

// Proc is one farm process with its output in a log file, so measurements can read what it
// logged and its CPU and memory from /proc while it lives.
type Proc struct {
	Name    string
	cmd     *exec.Cmd
	logPath string
	done    <-chan struct{}
}

// StartProc starts bin with args and extra environment, its output in logPath.
func StartProc(name, bin, logPath string, env []string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "TILEFARM_LOG_FORMAT=text"), env...)
	done, err := proctest.Launch(cmd, logPath, name+" "+strings.Join(args, " "))
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return &Proc{Name: name, cmd: cmd, logPath: logPath, done: done}, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Log is everything the process wrote so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill kills the process with SIGKILL and waits until it is gone.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// WaitLog waits until the log matches rx at or after byte offset from and returns the offset
// just past the match.
func (p *Proc) WaitLog(ctx context.Context, rx *regexp.Regexp, from int, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for {
		l := p.Log()
		if from < len(l) {
			if loc := rx.FindStringIndex(l[from:]); loc != nil {
				return from + loc[1], nil
			}
		}
		if p.Exited() {
			return 0, fmt.Errorf("%s exited before logging %q", p.Name, rx)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s did not log %q within %v", p.Name, rx, d)
		}
		if !queue.Sleep(ctx, 10*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}

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
	if c.Proc, err = StartProc("coordinator", bin, filepath.Join(dir, "serve.log"), env, args...); err != nil {
		return nil, err
	}
	if err := WaitHealthy(ctx, httpAddr, c.Proc); err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}
