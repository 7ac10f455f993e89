//go:build unix

package proctest

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProcWaitLogAndKill(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "sh.log")
	p, err := Start("sh", "/bin/sh", logPath, []string{"PROCTEST_WORD=ready"}, "-c", `echo "$PROCTEST_WORD 42"; echo second; sleep 30`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	m, err := p.WaitLog(t.Context(), regexp.MustCompile(`ready (\d+)`), 0, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Groups) != 2 || m.Groups[0] != "ready 42" || m.Groups[1] != "42" || m.End != len("ready 42") {
		t.Fatalf("match %+v, want groups [ready 42, 42] ending at %d", m, len("ready 42"))
	}
	// The banner names the arguments, which hold "ready" too: the log starts after it.
	if l := p.Log(); !strings.HasPrefix(l, "ready 42\n") {
		t.Fatalf("log %q does not start with the process's own output", l)
	}
	if _, err := p.WaitLog(t.Context(), regexp.MustCompile(`ready`), m.End, 200*time.Millisecond); err == nil {
		t.Fatal("found ready again past the first match")
	}
	if p.Exited() || p.ExitCode() != -1 {
		t.Fatalf("exited %v (code %d) while it sleeps", p.Exited(), p.ExitCode())
	}
	p.Signal(syscall.SIGSTOP)
	p.Kill() // a stopped process dies too
	if !p.Exited() {
		t.Fatal("not exited after Kill")
	}
	if !p.WaitExit(time.Second) {
		t.Fatal("WaitExit false after Kill")
	}
	p.Signal(syscall.SIGTERM) // on a reaped process: nothing happens
	if _, err := p.WaitLog(t.Context(), regexp.MustCompile(`never`), 0, time.Minute); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitLog on an exited process: %v, want an error saying it exited", err)
	}
}

func TestProcExitCode(t *testing.T) {
	p, err := Start("sh", "/bin/sh", filepath.Join(t.TempDir(), "sh.log"), nil, "-c", "exit 3")
	if err != nil {
		t.Fatal(err)
	}
	if !p.WaitExit(10 * time.Second) {
		p.Kill()
		t.Fatal("sh -c 'exit 3' did not exit")
	}
	if code := p.ExitCode(); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
}

func TestProcWaitLogContext(t *testing.T) {
	p, err := Start("sh", "/bin/sh", filepath.Join(t.TempDir(), "sh.log"), nil, "-c", "sleep 30")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := p.WaitLog(ctx, regexp.MustCompile(`x`), 0, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitLog with a cancelled context: %v", err)
	}
}
