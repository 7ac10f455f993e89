package blender

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// DriverVersion names the driver script's content: it is part of every Build fingerprint, so a
// change to how tiles are rendered can never resume or reuse tiles rendered the old way.
var DriverVersion = func() string {
	sum := sha256.Sum256(driverScript)
	return hex.EncodeToString(sum[:6])
}()

// DefaultHangTimeout is how long a Blender process may go without a sign of life (a reply or
// a heartbeat, which the driver writes every second, rendering or not) before it is killed.
const DefaultHangTimeout = 2 * time.Minute

// Options configure a Pool.
type Options struct {
	Binary string // the Blender executable; "" means "blender" on PATH
	Dir    string // working directory for the driver and rendered passes (required)
	Size   int    // processes at most, one per worker slot; < 1 means 1
	// Threads is how many threads each process renders with; < 1 means 1. A tile's bits do not
	// depend on it (measured on the plate on every line, docs/design.md "Blender scenes").
	Threads     int
	HangTimeout time.Duration // 0 means DefaultHangTimeout
	// Kernel caps the Cycles CPU kernel ("avx2", "avx", "sse41", "sse2"; "" is the best this
	// CPU has), so machines of different CPUs can render with one build (Kernels).
	Kernel string
	// BuildCache is a directory where the build a Blender reported is remembered (buildCache),
	// so Build answers without starting one when this machine asked before; "" asks Blender
	// every time a pool starts.
	BuildCache string
	Log        *slog.Logger
}

// Kernels are the Cycles CPU kernels a pool may be capped to, best first, each with the
// variables that make Cycles skip the better ones. The kernel is part of the build's
// fingerprint: kernels differ in their last bits.
var Kernels = []struct{ Name, Env string }{
	{"avx2", ""},
	{"avx", "CYCLES_CPU_NO_AVX2=1"},
	{"sse41", "CYCLES_CPU_NO_AVX2=1 CYCLES_CPU_NO_AVX=1"},
	{"sse2", "CYCLES_CPU_NO_AVX2=1 CYCLES_CPU_NO_AVX=1 CYCLES_CPU_NO_SSE41=1 CYCLES_CPU_NO_SSE3=1"},
}

// kernelEnv is the environment of a Blender capped to kernel; an unknown kernel is an error.
func kernelEnv(kernel string) ([]string, error) {
	if kernel == "" {
		return nil, nil
	}
	var names []string
	for _, k := range Kernels {
		if k.Name == kernel {
			return strings.Fields(k.Env), nil
		}
		names = append(names, k.Name)
	}
	return nil, fmt.Errorf("%w: unknown Cycles kernel %q: want one of %s", ErrNotFound, kernel, strings.Join(names, ", "))
}

// Pool runs up to Size persistent Blender processes, started on first use and restarted when
// one dies or hangs. A request runs on an idle process that has its .blend open already if
// there is one, so a slot rendering the passes of one shot opens its file once.
type Pool struct {
	o     Options
	slots chan struct{}

	mu     sync.Mutex
	idle   []*process
	procs  int           // processes running or starting, idle or not
	wake   chan struct{} // closed when a process becomes idle or one is gone
	closed bool
	build  string
	seq    int
	cache  buildCache
	// cached says build came from the cache and no process of the pool confirmed it yet.
	cached bool
}

// NewPool makes a pool; no process starts until one is needed.
func NewPool(o Options) *Pool {
	if o.Binary == "" {
		o.Binary = "blender"
	}
	if o.Size < 1 {
		o.Size = 1
	}
	o.Threads = max(o.Threads, 1)
	if o.HangTimeout <= 0 {
		o.HangTimeout = DefaultHangTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if abs, err := filepath.Abs(o.Dir); err == nil {
		o.Dir = abs // Blender runs in its own working directory
	}
	return &Pool{o: o, slots: make(chan struct{}, o.Size), wake: make(chan struct{}), cache: newBuildCache(o)}
}

// Build is the fingerprint of the pool's Blender: its version and build, the Cycles kernel and
// BVH it uses on this CPU, and the driver's version. Tiles rendered under different
// fingerprints may differ in their last bits, so all workers of a farm must share one.
func (p *Pool) Build(ctx context.Context) (string, error) {
	p.mu.Lock()
	b := p.build
	p.mu.Unlock()
	if b != "" {
		return b, nil
	}
	if b := p.cache.load(); b != "" {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.build == "" {
			p.build, p.cached = b, true
		}
		return p.build, nil
	}
	err := p.with(ctx, "", func(*process) error { return nil })
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cache.store(p.build)
	return p.build, nil
}

func fingerprint(b Build) string {
	return fmt.Sprintf("blender/%s (%s) cycles-cpu/%s bvh/%s denoise/%s driver/%s", b.Version, b.Hash, b.Kernel, b.BVH, b.Denoiser, DriverVersion)
}

// with runs fn on a process, preferring one with file open. A process fn leaves in trouble
// (any error wrapping ErrProcess, or a cancelled ctx, which kills it) is discarded.
func (p *Pool) with(ctx context.Context, file string, fn func(*process) error) error {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { <-p.slots }()
	proc, err := p.take(ctx, file)
	if err != nil {
		return err
	}
	err = fn(proc)
	if err != nil && (errors.Is(err, ErrProcess) || ctx.Err() != nil || !proc.alive()) {
		proc.kill()
		p.mu.Lock()
		p.procs--
		p.notifyLocked()
		p.mu.Unlock()
		return err
	}
	p.put(proc)
	return err
}

// call sends req, about file, to a process that has file open if one is idle (the driver opens
// it as needed) and returns the reply line.
func (p *Pool) call(ctx context.Context, file string, req any) ([]byte, error) {
	var line []byte
	err := p.with(ctx, file, func(proc *process) (err error) {
		if line, err = proc.call(ctx, req); err == nil {
			proc.file = file
		}
		return err
	})
	return line, err
}

// take returns an idle process (with file open if possible), or starts one while the pool has
// fewer than Size, or waits for one that is starting (Warm) to be ready. The caller holds a
// slot, so at most Size-1 processes are busy elsewhere: one is always idle or on its way.
func (p *Pool) take(ctx context.Context, file string) (*process, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: pool closed", ErrProcess)
		}
		if proc := p.pickLocked(file); proc != nil {
			p.mu.Unlock()
			return proc, nil
		}
		if p.procs < p.o.Size {
			p.procs++
			p.mu.Unlock()
			proc, err := p.start(ctx)
			if err != nil {
				return nil, err
			}
			return proc, nil
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// pickLocked removes and returns the idle process to use for file (one with it open if any),
// forgetting idle processes that died; nil if none is idle.
func (p *Pool) pickLocked(file string) *process {
	pick := -1
	alive := p.idle[:0]
	for _, proc := range p.idle {
		if !proc.alive() {
			p.procs--
			continue
		}
		if pick < 0 || proc.file == file {
			pick = len(alive)
		}
		alive = append(alive, proc)
	}
	p.idle = alive
	if pick < 0 {
		return nil
	}
	proc := p.idle[pick]
	p.idle = append(p.idle[:pick], p.idle[pick+1:]...)
	return proc
}

// start starts a process the caller has counted in procs (uncounting it if it fails) and
// checks that it reports the pool's build.
func (p *Pool) start(ctx context.Context) (*process, error) {
	p.mu.Lock()
	p.seq++
	n := p.seq
	p.mu.Unlock()
	fail := func(err error) (*process, error) {
		p.mu.Lock()
		p.procs--
		p.notifyLocked()
		p.mu.Unlock()
		return nil, err
	}
	dir := filepath.Join(p.o.Dir, "blender")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(fmt.Errorf("%w: creating %s: %v", ErrProcess, dir, err))
	}
	proc, err := startProcess(ctx, p.o, dir, p.o.Log.With("blender_process", n))
	if err != nil {
		return fail(err)
	}
	p.o.Log.Debug("blender process started", "pid", proc.cmd.Process.Pid, "version", proc.build.Version, "kernel", proc.build.Kernel)
	p.mu.Lock()
	fp := fingerprint(proc.build)
	if p.build == "" {
		p.build = fp
	}
	mismatch, cached := p.build != fp, p.cached
	p.cached = p.cached && mismatch
	p.mu.Unlock()
	if mismatch {
		proc.kill()
		if cached {
			// The machine's Blender is not the one remembered: the next start asks it again.
			p.cache.forget()
			return fail(fmt.Errorf("%w: Blender reports %q, not the build this worker announced from its cache, %q: restart the worker", ErrProcess, fp, p.build))
		}
		return fail(fmt.Errorf("%w: a restarted Blender reports %q, the pool started as %q", ErrProcess, fp, p.build))
	}
	return proc, nil
}

// put returns a process to the idle ones (or stops it if the pool is closed).
func (p *Pool) put(proc *process) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.procs--
		go proc.stop()
		return
	}
	p.idle = append(p.idle, proc)
	p.notifyLocked()
}

// notifyLocked wakes every take waiting for a process.
func (p *Pool) notifyLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// Warm starts, in the background, as many processes as the pool is short of its size: once
// one Blender tile has arrived, more are likely, and a slot should not wait a Blender start-up
// (a second or two) when its turn comes. A process that fails to start is only logged: the
// request that needs it will try again and report why.
func (p *Pool) Warm(ctx context.Context) {
	p.mu.Lock()
	n := 0
	if !p.closed {
		n = p.o.Size - p.procs
		p.procs += n
	}
	p.mu.Unlock()
	for range n {
		go func() {
			proc, err := p.start(ctx)
			if err != nil {
				p.o.Log.Warn("starting a Blender process", "err", err)
				return
			}
			p.put(proc)
		}()
	}
}

// Close stops every idle process; busy ones stop when their request ends.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.procs -= len(idle)
	p.notifyLocked()
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, proc := range idle {
		wg.Add(1)
		go func() {
			defer wg.Done()
			proc.stop()
		}()
	}
	wg.Wait()
	return nil
}

// scratch returns a fresh path in the pool's directory for one output file.
func (p *Pool) scratch(ext string) (string, error) {
	dir := filepath.Join(p.o.Dir, "blender", "out")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "pass-*"+ext)
	if err != nil {
		return "", fmt.Errorf("creating output file: %w", err)
	}
	name := f.Name()
	f.Close()
	return name, nil
}

// Binary is the build's executable (or Python) the pool runs, as it was given.
func (p *Pool) Binary() string { return p.o.Binary }
