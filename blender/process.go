package blender

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

//go:embed driver.py
var driverScript []byte

// startTimeout bounds how long a new Blender process may take to say hello.
const startTimeout = 2 * time.Minute

// process is one running Blender with driver.py, serving one request at a time.
type process struct {
	cmd    *exec.Cmd
	req    *os.File      // requests, one JSON line each
	lines  chan []byte   // replies and progress lines, closed when Blender's reply pipe closes
	exited chan struct{} // closed when the process has been waited for
	logs   *tailLog
	build  Build
	file   string // the .blend open in it, "" before the first
	hang   time.Duration
	log    *slog.Logger
}

// Build is what decides Cycles' bits on a machine, as the driver reports it.
type Build struct {
	Version string `json:"version"`
	Hash    string `json:"hash"`
	Kernel  string `json:"kernel"`
	BVH     string `json:"bvh"`
	Cycles  bool   `json:"cycles"`
	// Denoiser is the denoiser the build has ("oidn" or "none"): a scene with denoising on
	// renders differently without one.
	Denoiser string `json:"denoiser"`
}

// reply is the part of every reply line the process itself reads.
type reply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error"`
	Scene bool   `json:"scene_error"`
	Alive bool   `json:"alive"`
	Build *Build `json:"build"`
	NoBpy bool   `json:"no_bpy"` // the hello of a Python that cannot import bpy
}

// startProcess runs o's Blender with the driver, which it writes into dir, and waits for its
// hello.
func startProcess(ctx context.Context, o Options, dir string, log *slog.Logger) (*process, error) {
	binary, hang := o.Binary, o.HangTimeout
	env, err := kernelEnv(o.Kernel)
	if err != nil {
		return nil, err
	}
	script, err := writeDriver(dir)
	if err != nil {
		return nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProcess, err)
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, fmt.Errorf("%w: %v", ErrProcess, err)
	}
	cmd := driverCommand(binary, script)
	pipes, started, err := prepareCommand(cmd, reqR, repW) // the pipes in the child, named for the driver
	if err != nil {
		for _, f := range []*os.File{reqR, reqW, repR, repW} {
			f.Close()
		}
		return nil, err
	}
	cmd.Args = append(cmd.Args, pipes...)
	cmd.Args = append(cmd.Args, strconv.Itoa(max(o.Threads, 1)))
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	p := &process{cmd: cmd, req: reqW, lines: make(chan []byte, 16), exited: make(chan struct{}),
		logs: newTailLog(40, log), hang: hang, log: log}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	err = cmd.Start()
	release := func() {}
	if err == nil {
		if r, serr := started(); serr != nil {
			log.Warn("Blender may outlive this worker", "err", serr)
		} else {
			release = r
		}
	}
	reqR.Close()
	repW.Close()
	if err != nil {
		reqW.Close()
		repR.Close()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %q (install Blender or its bpy module and point --blender at it, README \"Blender lines\"): %v", ErrNotFound, binary, err)
		}
		return nil, fmt.Errorf("%w: starting %q: %v", ErrProcess, binary, err)
	}
	go p.read(repR)
	go func() {
		_ = cmd.Wait()
		release() // ends what Blender started, where the platform can (prepareCommand)
		close(p.exited)
	}()
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	line, err := p.next(sctx, startTimeout)
	if err == nil {
		var r reply
		if jerr := json.Unmarshal(line, &r); jerr == nil && r.NoBpy {
			err = fmt.Errorf("%w: %q is not a Blender build: %s", ErrNotFound, binary, r.Error)
		} else if jerr != nil || !r.OK || r.Build == nil {
			err = fmt.Errorf("%w: unexpected hello %q", ErrProcess, line)
		} else if !r.Build.Cycles {
			err = fmt.Errorf("%w: %q was built without Cycles", ErrNotFound, binary)
		} else {
			p.build = *r.Build
		}
	}
	if err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// IsPython reports whether binary names a Python interpreter (its file name starts with
// "python": python3, python3.11, python.exe) rather than a Blender executable. A Python is a
// Blender build when it imports bpy, Blender as a Python module (README, "Blender lines").
func IsPython(binary string) bool {
	return strings.HasPrefix(strings.ToLower(filepath.Base(binary)), "python")
}

// driverCommand runs driver.py (at script) on a build: Blender's executable runs it as its
// --python script in the background, with factory settings and auto-run scripts off; a Python
// with bpy runs it as a script, which then does what those flags do itself (driver.py,
// module_mode). Neither gets -t: Blender's -t overrides the threads a scene fixes, and each
// render sets its own (a slot's, or more that idle slots lend, Tile.SetThreads). The driver's
// own arguments follow the "--" the command ends with: its request and reply pipes
// (prepareCommand) and the threads a slot renders with. Blender 3.4, 4.2, 4.5 and 5.0 wrote the
// same bits for the plate with 1, 2 and 8 threads.
func driverCommand(binary, script string) *exec.Cmd {
	if IsPython(binary) {
		return exec.Command(binary, script, "--")
	}
	return exec.Command(binary, "-b", "--factory-startup", "--disable-autoexec",
		"--python-exit-code", "70", "--python", script, "--")
}

// writeDriver puts driver.py into dir (once per content), where Blender reads it.
func writeDriver(dir string) (string, error) {
	path := dir + "/tilefarm-driver-" + DriverVersion + ".py"
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, driverScript) {
		return path, nil
	}
	tmp, err := os.CreateTemp(dir, ".driver-*")
	if err == nil {
		_, err = tmp.Write(driverScript)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
	}
	if err != nil {
		return "", fmt.Errorf("%w: writing the driver script: %v", ErrProcess, err)
	}
	return path, nil
}

// read forwards every line Blender writes on the reply pipe.
func (p *process) read(r io.ReadCloser) {
	defer r.Close()
	defer close(p.lines)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		p.lines <- bytes.Clone(sc.Bytes())
	}
}

// next waits for the next line, at most hang since the last sign of life.
func (p *process) next(ctx context.Context, hang time.Duration) ([]byte, error) {
	timer := time.NewTimer(hang)
	defer timer.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			return nil, p.died()
		}
		return line, nil
	case <-timer.C:
		return nil, p.withOutput(fmt.Errorf("%w: no sign of life for %v; killed it%s", ErrProcess, hang, p.logs.suffix()))
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// died describes a process whose reply pipe closed.
func (p *process) died() error {
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
	state := "exited"
	if ps := p.cmd.ProcessState; ps != nil {
		state = ps.String()
	}
	return p.withOutput(fmt.Errorf("%w: blender %s%s", ErrProcess, state, p.logs.suffix()))
}

// call sends one request and returns its reply line. Heartbeat lines reset the hang timer. A
// cancelled ctx or a hang kills the process: a render cannot be stopped any other way. Errors
// of the scene wrap ErrScene; anything else wraps ErrProcess, and the process must then be
// discarded.
func (p *process) call(ctx context.Context, req any) ([]byte, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	if _, err := p.req.Write(append(b, '\n')); err != nil {
		return nil, p.withOutput(fmt.Errorf("%w: sending request: %v%s", ErrProcess, err, p.logs.suffix()))
	}
	for {
		line, err := p.next(ctx, p.hang)
		if err != nil {
			p.kill()
			return nil, err
		}
		var r reply
		if err := json.Unmarshal(line, &r); err != nil {
			p.kill()
			return nil, fmt.Errorf("%w: unreadable reply %q", ErrProcess, line)
		}
		switch {
		case r.Alive:
			continue
		case r.OK:
			return line, nil
		case r.Scene:
			return nil, p.withOutput(fmt.Errorf("%w: %s", ErrScene, r.Error))
		default:
			return nil, p.withOutput(fmt.Errorf("%w: %s%s", ErrProcess, r.Error, p.logs.suffix()))
		}
	}
}

// alive reports whether the process has not exited.
func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill ends the process at once and waits for it.
func (p *process) kill() {
	p.req.Close()
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.log.Warn("blender process did not exit after SIGKILL", "pid", p.cmd.Process.Pid)
	}
}

// stop asks the process to finish (it exits when its requests pipe closes), then kills it if
// it takes longer than a few seconds.
func (p *process) stop() {
	p.req.Close()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.kill()
	}
}

// outputLines is how many of the last lines Blender printed an error carries.
const outputLines = 16

// OutputError is an error of a Blender process with the last lines Blender printed before
// it (its stdout and stderr), which the farm records with a failed attempt.
type OutputError struct {
	Err    error
	Output []string
}

func (e *OutputError) Error() string { return e.Err.Error() }
func (e *OutputError) Unwrap() error { return e.Err }

// RendererOutput is the lines Blender printed last, oldest first.
func (e *OutputError) RendererOutput() []string { return e.Output }

// withOutput wraps err with the last lines the process printed.
func (p *process) withOutput(err error) error {
	return &OutputError{Err: err, Output: p.logs.last(outputLines)}
}

// tailLog keeps the last lines Blender printed, for error messages, and logs each at debug.
type tailLog struct {
	mu    sync.Mutex
	limit int
	lines []string
	part  []byte
	log   *slog.Logger
}

func newTailLog(limit int, log *slog.Logger) *tailLog { return &tailLog{limit: limit, log: log} }

func (t *tailLog) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.part = append(t.part, b...)
	for {
		i := bytes.IndexByte(t.part, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(t.part[:i]), "\r")
		t.part = t.part[i+1:]
		if line == "" {
			continue
		}
		t.log.Debug("blender", "line", line)
		t.lines = append(t.lines, line)
		if len(t.lines) > t.limit {
			t.lines = t.lines[len(t.lines)-t.limit:]
		}
	}
	if len(t.part) > 64<<10 {
		t.part = t.part[:0] // a runaway line without newline: drop it
	}
	return len(b), nil
}

// last returns the newest n lines, oldest first.
func (t *tailLog) last(n int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines[max(0, len(t.lines)-n):]...)
}

// suffix is ": last output: ..." with the lines most likely to explain a failure.
func (t *tailLog) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keep []string
	for _, l := range t.lines {
		low := strings.ToLower(l)
		if strings.Contains(low, "error") || strings.Contains(low, "warning") || strings.Contains(low, "traceback") ||
			strings.Contains(low, "fatal") || strings.Contains(low, "segmentation") {
			keep = append(keep, l)
		}
	}
	if len(keep) == 0 && len(t.lines) > 0 {
		keep = t.lines[max(0, len(t.lines)-3):]
	}
	if len(keep) > 6 {
		keep = keep[len(keep)-6:]
	}
	if len(keep) == 0 {
		return ""
	}
	return "; blender said: " + strings.Join(keep, " | ")
}
