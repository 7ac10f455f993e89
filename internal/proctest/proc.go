package proctest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// logPoll is how often WaitLog reads the log again: often enough that a test waiting for a
// line loses little time, seldom enough that rereading a busy worker's log costs little CPU
// on a small machine.
const logPoll = 50 * time.Millisecond

// Proc is one launched process with its output in a log file, so a test can signal and kill
// it, wait for it to exit, and read or wait for what it logged.
type Proc struct {
	Name    string // the name it was started under, for messages
	cmd     *exec.Cmd
	logPath string
	start   int64 // where its own output starts in logPath, past the banner
	done    <-chan struct{}
}

// Start starts bin with args and the test's environment plus env, its output appended to
// logPath after a banner line naming it and its arguments (Launch). Log and WaitLog read only
// what the process wrote, so neither a later process appending to the same file nor an
// argument echoed in the banner (a password in a URL, say) shows in them.
func Start(name, bin, logPath string, env []string, args ...string) (*Proc, error) {
	return StartCmd(name, exec.Command(bin, args...), logPath, env)
}

// StartCmd is Start of a command made elsewhere (one that runs on another host, say: a
// network namespace's "ip netns exec", which execs the program in its own process, so
// signals reach the program itself); env is added to this process's environment.
func StartCmd(name string, cmd *exec.Cmd, logPath string, env []string) (*Proc, error) {
	cmd.Env = append(os.Environ(), env...)
	done, start, err := launch(cmd, logPath, name+" "+strings.Join(cmd.Args[1:], " "))
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return &Proc{Name: name, cmd: cmd, logPath: logPath, start: start, done: done}, nil
}

// Pid is the process id, for reading /proc or finding the process's children.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitCode is the process's exit code once it has exited, and -1 while it runs or if a signal
// ended it.
func (p *Proc) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	return p.cmd.ProcessState.ExitCode() // set by Wait before done was closed
}

// Signal sends s to the process unless it has already exited: faults signal processes that
// may have died of an earlier one, and a finished process has nothing to receive it.
func (p *Proc) Signal(s syscall.Signal) {
	if !p.Exited() {
		_ = p.cmd.Process.Signal(s)
	}
}

// Kill thaws the process (a test may have stopped it with SIGSTOP), kills it with SIGKILL and
// waits until it is reaped, so its log is complete and its ports are free when Kill returns.
func (p *Proc) Kill() {
	p.thaw()
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// WaitExit waits up to d for the process to exit by itself and reports whether it did.
func (p *Proc) WaitExit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// Log is everything the process has written so far.
func (p *Proc) Log() string { return p.logFrom(0) }

// logFrom is the process's output from byte offset off of Log on.
func (p *Proc) logFrom(off int) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, p.start+int64(off), 1<<62))
	return string(b)
}

// LogMatch is what WaitLog found.
type LogMatch struct {
	// Groups are the match and its submatches, as regexp.FindStringSubmatch returns them.
	Groups []string
	// End is the offset in Log just past the match, to wait for a later line from.
	End int
}

// WaitLog waits up to d, or until ctx is done, for the log from byte offset from on to match
// rx. It fails as soon as the process has exited without logging it, since nothing more
// will come.
func (p *Proc) WaitLog(ctx context.Context, rx *regexp.Regexp, from int, d time.Duration) (LogMatch, error) {
	deadline := time.Now().Add(d)
	for {
		exited := p.Exited() // before the read, so a line written just before the exit is in it
		l := p.logFrom(from)
		if loc := rx.FindStringSubmatchIndex(l); loc != nil {
			m := LogMatch{Groups: make([]string, len(loc)/2), End: from + loc[1]}
			for i := range m.Groups {
				if loc[2*i] >= 0 {
					m.Groups[i] = l[loc[2*i]:loc[2*i+1]]
				}
			}
			return m, nil
		}
		if exited {
			return LogMatch{}, fmt.Errorf("%s exited before logging %q", p.Name, rx)
		}
		if time.Now().After(deadline) {
			return LogMatch{}, fmt.Errorf("%s did not log %q within %v", p.Name, rx, d)
		}
		select {
		case <-ctx.Done():
			return LogMatch{}, fmt.Errorf("waiting for %s to log %q: %w", p.Name, rx, ctx.Err())
		case <-time.After(logPoll):
		}
	}
}
