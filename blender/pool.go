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
	Binary      string        // the Blender executable; "" means "blender" on PATH
	Dir         string        // working directory for the driver and rendered passes (required)
	Size        int           // processes at most, one per worker slot; < 1 means 1
	HangTimeout time.Duration // 0 means DefaultHangTimeout
	Log         *slog.Logger
}

// Pool runs up to Size persistent Blender processes, started on first use and restarted when
// one dies or hangs. A request runs on an idle process that has its .blend open already if
// there is one, so a slot rendering the passes of one shot opens its file once.
type Pool struct {
	o     Options
	slots chan struct{}

	mu     sync.Mutex
	idle   []*process
	closed bool
	build  string
	seq    int
}

// NewPool makes a pool; no process starts until one is needed.
func NewPool(o Options) *Pool {
	if o.Binary == "" {
		o.Binary = "blender"
	}
	if o.Size < 1 {
		o.Size = 1
	}
	if o.HangTimeout <= 0 {
		o.HangTimeout = DefaultHangTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if abs, err := filepath.Abs(o.Dir); err == nil {
		o.Dir = abs // Blender runs in its own working directory
	}
	return &Pool{o: o, slots: make(chan struct{}, o.Size)}
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
	err := p.with(ctx, "", func(*process) error { return nil })
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.build, nil
}

func fingerprint(b Build) string {
	return fmt.Sprintf("blender/%s (%s) cycles-cpu/%s bvh/%s driver/%s", b.Version, b.Hash, b.Kernel, b.BVH, DriverVersion)
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
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		proc.stop()
		return err
	}
	p.idle = append(p.idle, proc)
	p.mu.Unlock()
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

// take returns an idle process (with file open if possible) or starts one.
func (p *Pool) take(ctx context.Context, file string) (*process, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: pool closed", ErrProcess)
	}
	pick := -1
	for i, proc := range p.idle {
		if !proc.alive() {
			continue
		}
		if pick < 0 || proc.file == file {
			pick = i
		}
	}
	var alive []*process
	var proc *process
	for i, q := range p.idle {
		switch {
		case i == pick:
			proc = q
		case q.alive():
			alive = append(alive, q)
		}
	}
	p.idle = alive
	p.seq++
	n := p.seq
	p.mu.Unlock()
	if proc != nil {
		return proc, nil
	}
	dir := filepath.Join(p.o.Dir, "blender")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: creating %s: %v", ErrProcess, dir, err)
	}
	proc, err := startProcess(ctx, p.o.Binary, dir, p.o.HangTimeout, p.o.Log.With("blender_process", n))
	if err != nil {
		return nil, err
	}
	p.o.Log.Debug("blender process started", "pid", proc.cmd.Process.Pid, "version", proc.build.Version, "kernel", proc.build.Kernel)
	p.mu.Lock()
	defer p.mu.Unlock()
	fp := fingerprint(proc.build)
	if p.build == "" {
		p.build = fp
	} else if p.build != fp {
		proc.kill()
		return nil, fmt.Errorf("%w: a restarted Blender reports %q, the pool started as %q", ErrProcess, fp, p.build)
	}
	return proc, nil
}

// Close stops every idle process; busy ones stop when their request ends.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
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
