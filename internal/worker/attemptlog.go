package worker

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// The last lines a worker logged about one delivery, so that its failure event can quote them
// and the monitor show a failed attempt's story as the worker's log told it (docs/design.md,
// "Failures, deliveries and the failure budget"; docs/operations.md, "Logs").

// Bounds of an attempt's log: what a failure event carries and the coordinator keeps per
// failed attempt.
const (
	maxAttemptLines    = 20
	maxAttemptLogBytes = 4 << 10
	maxAttemptLine     = 1 << 10
)

// attemptLog keeps the newest lines logged about one delivery, debug ones included (the
// worker's log shows info and above), each as the text handler writes it, without the
// delivery's own attributes (its ids), which the failure event carries anyway.
type attemptLog struct {
	mu    sync.Mutex
	lines []string
}

// Write takes one record as the text handler formats it: each Handle writes one line.
func (a *attemptLog) Write(p []byte) (int, error) {
	a.add(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// add appends lines, keeping the newest maxAttemptLines, each cut at maxAttemptLine bytes.
func (a *attemptLog) add(lines ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range lines {
		if len(l) > maxAttemptLine {
			l = l[:maxAttemptLine] + "..."
		}
		a.lines = append(a.lines, l)
	}
	if n := len(a.lines) - maxAttemptLines; n > 0 {
		a.lines = append(a.lines[:0], a.lines[n:]...)
	}
}

// tail is the newest lines that fit in maxAttemptLogBytes, oldest first.
func (a *attemptLog) tail() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	size, first := 0, len(a.lines)
	for first > 0 && size+len(a.lines[first-1])+1 <= maxAttemptLogBytes {
		first--
		size += len(a.lines[first]) + 1
	}
	return append([]string(nil), a.lines[first:]...)
}

// handler is the slog handler that writes into a.
func (a *attemptLog) handler() slog.Handler {
	return slog.NewTextHandler(a, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(groups []string, at slog.Attr) slog.Attr {
		if len(groups) == 0 && at.Key == slog.TimeKey {
			return slog.String(slog.TimeKey, at.Value.Time().UTC().Format("15:04:05.000"))
		}
		return at
	}})
}

// teeHandler logs to main as the worker's log does and records every record, whatever main's
// level, with rec. The attributes a logger is given With are main's alone: they name the
// delivery, which a recorded line need not repeat.
type teeHandler struct{ main, rec slog.Handler }

// recorded returns log recording what it logs into a.
func recorded(log *slog.Logger, a *attemptLog) *slog.Logger {
	return slog.New(teeHandler{main: log.Handler(), rec: a.handler()})
}

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.main.Enabled(ctx, l) || h.rec.Enabled(ctx, l)
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.rec.Enabled(ctx, r.Level) {
		_ = h.rec.Handle(ctx, r.Clone()) // it writes to memory: nothing to fail
	}
	if h.main.Enabled(ctx, r.Level) {
		return h.main.Handle(ctx, r)
	}
	return nil
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{main: h.main.WithAttrs(as), rec: h.rec}
}

func (h teeHandler) WithGroup(name string) slog.Handler {
	return teeHandler{main: h.main.WithGroup(name), rec: h.rec.WithGroup(name)}
}

// rendererLines marks the lines of a renderer's output (scene.RendererOutput) among the
// worker's own in an attempt's log.
func rendererLines(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = "renderer: " + l
	}
	return out
}
