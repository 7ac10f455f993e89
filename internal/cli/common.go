// Package cli implements the coordinator and tileworker commands. The binaries in cmd/ only
// call Coordinator and Tileworker, so tests can run the same code in-process.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/store"
	"github.com/tilefarm/tilefarm/render"
)

// Exit codes of the command contract (docs/operations.md): scripts and cron jobs rely on them.
const (
	ExitOK         = 0
	ExitFailed     = 1
	ExitUsage      = 2
	ExitInProgress = 3
	ExitQueued     = 42
	ExitBusy       = 75
	ExitInterrupt  = 130
)

// usageError is a command-line mistake (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitCode maps an error onto the contract's exit codes and prints it.
func exitCode(stderr io.Writer, cmd string, err error) int {
	if err == nil {
		return ExitOK
	}
	var ue *usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return ExitOK // the usage was asked for and printed
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s -h' for usage.\n", cmd, err, cmd)
		return ExitUsage
	case errors.Is(err, context.Canceled):
		fmt.Fprintf(stderr, "%s: interrupted\n", cmd)
		return ExitInterrupt
	case errors.Is(err, coordinator.ErrBusy), errors.Is(err, client.ErrUnavailable):
		fmt.Fprintf(stderr, "%s: %v (retry later)\n", cmd, err)
		return ExitBusy
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
	return ExitFailed
}

// newFlags makes a FlagSet whose usage text starts with synopsis and description.
func newFlags(name, synopsis, description string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\n%s\n\nFlags:\n", synopsis, strings.TrimSpace(description))
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses flags that may come before or after the positional arguments.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseFrames parses "A-B" or "N".
func parseFrames(s string) (first, last int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil {
		return 0, 0, usagef("--frames %q: want A-B or N, e.g. 1-24", s)
	}
	return first, last, coordinator.CheckFrameRange(first, last)
}

// formatFor picks the output format from an explicit flag or the output file's extension.
func formatFor(flagValue, out string) (string, error) {
	f := flagValue
	if f == "" {
		switch strings.ToLower(filepath.Ext(out)) {
		case ".exr":
			f = "exr"
		default:
			f = "png"
		}
	}
	if _, ok := farm.FrameOutputName(f); !ok {
		return "", usagef("--format %q: want png, png16 or exr", f)
	}
	return f, nil
}

// formatList parses submit's comma-separated --format list.
func formatList(flagValue string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(flagValue, ",") {
		f, err := formatFor(strings.TrimSpace(f), "")
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

func newLogger(stderr io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l})), nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// killSelf is the crash hook of fault tests: it kills this process with SIGKILL at a seam, so
// the test sees exactly what a real crash there leaves behind.
func killSelf(log *slog.Logger, process, seam string) {
	log.Warn("fault injection: killing "+process, "seam", seam)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Hour)
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// renderFlags are the settings overrides shared by render, submit and tileworker render.
type renderFlags struct {
	spp, width, height, tile, passes int
	camera                           string
}

func addRenderFlags(fs *flag.FlagSet) *renderFlags {
	rf := &renderFlags{}
	fs.IntVar(&rf.spp, "spp", 0, "samples per pixel (default: the scene's)")
	fs.IntVar(&rf.width, "width", 0, "image width override")
	fs.IntVar(&rf.height, "height", 0, "image height override")
	fs.StringVar(&rf.camera, "camera", "", "camera name (default: the scene's)")
	fs.Func("tile", "tile size in pixels, 1-4096 (default 64, 256 for Blender scenes; never changes a pixel)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4096 {
			return fmt.Errorf("--tile wants 1-4096, got %q", v)
		}
		rf.tile = n
		return nil
	})
	fs.IntVar(&rf.passes, "passes", 0, "Blender scenes: passes each tile's samples are split into, each a checkpoint (default 4; part of the frame's identity)")
	return rf
}

// check rejects values no scene could accept; the scene validates the rest and names the field.
func (rf *renderFlags) check() error {
	if rf.passes < 0 {
		return usagef("--passes %d: want at least 1", rf.passes)
	}
	return nil
}

// overrides are the settings the flags change.
func (rf *renderFlags) overrides() render.Overrides {
	return render.Overrides{Camera: rf.camera, Width: rf.width, Height: rf.height, SPP: rf.spp, Passes: rf.passes}
}
