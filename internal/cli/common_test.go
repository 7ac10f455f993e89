package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/tilefarm/tilefarm/blender/blendscene"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/kinds"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

func TestParseFrames(t *testing.T) {
	for _, c := range []struct {
		in          string
		first, last int
	}{
		{"1-24", 1, 24},
		{"7", 7, 7},
		{"0-0", 0, 0},
		{" 3 - 5 ", 3, 5},
		{"100-100", 100, 100},
		{fmt.Sprintf("1-%d", coordinator.MaxFramesPerJob), 1, coordinator.MaxFramesPerJob},
	} {
		first, last, err := parseFrames(c.in)
		if err != nil || first != c.first || last != c.last {
			t.Errorf("parseFrames(%q) = %d, %d, %v; want %d, %d", c.in, first, last, err, c.first, c.last)
		}
	}
	for _, in := range []string{"a-b", "", "1-", "-5", "1..4", "1-2-3", "x", "1-b"} {
		_, _, err := parseFrames(in)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("parseFrames(%q) error %v, want a usage error", in, err)
		} else if !strings.Contains(err.Error(), "--frames") {
			t.Errorf("parseFrames(%q) error %q does not name --frames", in, err)
		}
	}
	for _, in := range []string{"5-2", fmt.Sprintf("1-%d", coordinator.MaxFramesPerJob+1)} {
		_, _, err := parseFrames(in)
		var ue *usageError
		if !errors.Is(err, api.ErrBadInput) || errors.As(err, &ue) {
			t.Errorf("parseFrames(%q) error %v, want ErrBadInput (exit 1), not a usage error", in, err)
		}
	}
	if _, _, err := parseFrames("5-2"); err == nil || !strings.Contains(err.Error(), "reversed") {
		t.Errorf("parseFrames(5-2) error %v does not say the range is reversed", err)
	}
}

func TestCheckPattern(t *testing.T) {
	ok := []struct {
		pattern     string
		first, last int
	}{
		{"out/shot_####.png", 1, 24},
		{"out/shot_####.png", 7, 7},
		{"out/still.png", 7, 7}, // one frame needs no ####
	}
	for _, c := range ok {
		if err := checkPattern(c.pattern, c.first, c.last); err != nil {
			t.Errorf("checkPattern(%q, %d, %d) = %v, want nil", c.pattern, c.first, c.last, err)
		}
	}
	bad := []struct {
		pattern     string
		first, last int
	}{
		{"out/shot.png", 1, 24}, // every frame would overwrite one file
		{"out/shot.png", 1, 2},
		{"", 1, 1},
	}
	for _, c := range bad {
		err := checkPattern(c.pattern, c.first, c.last)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("checkPattern(%q, %d, %d) = %v, want a usage error", c.pattern, c.first, c.last, err)
		} else if c.pattern != "" && !strings.Contains(err.Error(), "####") {
			t.Errorf("checkPattern(%q) error %q does not mention ####", c.pattern, err)
		}
	}
}

func TestDefaultFormat(t *testing.T) {
	for _, c := range []struct {
		kind      scene.Kind
		out, want string
	}{
		{jsonscene.Kind{}, "out/a_####.png", "png"},
		{jsonscene.Kind{}, "out/a_####.exr", "exr"},
		{jsonscene.Kind{}, "out/a_####.EXR", "exr"},
		{jsonscene.Kind{}, "out/a_####", "png"},
		// A .blend is written as Blender writes it, whatever --out's extension says.
		{blendscene.New(blendscene.Options{}, scene.Env{}), "out/a_####.png", "blend"},
		{blendscene.New(blendscene.Options{}, scene.Env{}), "", "blend"},
	} {
		if got := defaultFormat(c.kind, c.out); got != c.want {
			t.Errorf("defaultFormat(%s, %q) = %q; want %q", c.kind.Name(), c.out, got, c.want)
		}
	}
	for _, f := range []string{"png", "png16", "exr", "blend", ""} {
		if err := checkFormat(f); err != nil {
			t.Errorf("checkFormat(%q) = %v", f, err)
		}
	}
	for _, f := range []string{"jpg", "PNG", "tiff"} {
		err := checkFormat(f)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), f) {
			t.Errorf("checkFormat(%q) = %v, want a usage error naming it", f, err)
		}
	}
}

// Property: a Blender scene's own output lands where Blender's -a or -o would put it: its own
// path under the .blend's directory, or --out with four digits appended when it has no '#' and
// the extension Blender gives the format; File Output files under the .blend's directory.
func TestMainPathAsBlenderNamesIt(t *testing.T) {
	for _, c := range []struct {
		pattern, name, want string
	}{
		{"", "//render/plate_0007.exr", "base/render/plate_0007.exr"},
		{"", "/abs/plate_0007.exr", "/abs/plate_0007.exr"},
		{"", "//../plate_0007.exr", "plate_0007.exr"}, // base/..: as Blender resolves it from the .blend
		{outPattern("out/f_", formatBlend), "//render/plate_0007.exr", "out/f_0007.exr"},
		{outPattern("out/f_##.exr", formatBlend), "//render/plate_0007.exr", "out/f_07.exr"},
		{outPattern("out/f_####.png", formatBlend), "//render/plate_0007.exr", "out/f_0007.exr"},
		{outPattern("out/h.v2_##", formatBlend), "//render/plate_0007.exr", "out/h.v2_07.exr"},
		{"out/f_####.png", "", "out/f_0007.png"},
	} {
		got, err := mainPath(outputDest{Pattern: c.pattern, Base: "base"}, c.name, 7)
		if err != nil || got != filepath.FromSlash(c.want) {
			t.Errorf("mainPath(%q, %q) = %q, %v; want %q", c.pattern, c.name, got, err, c.want)
		}
	}
	if _, err := mainPath(outputDest{Base: "base"}, "", 7); err == nil {
		t.Error("mainPath wrote a farm format with no --out")
	}
	to, err := framePaths(outputDest{Base: "base"}, 7, "//render/plate_0007.exr", []string{"render/depth/depth_0007.png"})
	if want := []string{filepath.FromSlash("base/render/plate_0007.exr"), filepath.FromSlash("base/render/depth/depth_0007.png")}; err != nil || !slices.Equal(to, want) {
		t.Errorf("framePaths = %q, %v; want %q", to, err, want)
	}
	if to, err := framePaths(outputDest{Base: "base"}, 7, "//a_0007.png", []string{"../escape.png"}); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), `"../escape.png"`) {
		t.Errorf("framePaths of a File Output file outside the .blend's directory = %q, %v; want bad input naming it", to, err)
	}
}

// Property: under outputs --dir (a confined dest) the scene's own output path stays under the
// directory: one leaving it, also after cleaning, or absolute is bad input (exit 1) naming the
// path and --out; one that stays under it after cleaning is written there, and --out, the
// user's own, goes where it says even when absolute.
func TestMainPathConfinedToDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b", "out")
	dest := outputDest{Base: dir, Confined: true}
	for _, name := range []string{"//../../escaped_0007.png", "//render/../../escaped_0007.png", "//..", "//", filepath.Join(root, "abs_0007.png")} {
		got, err := mainPath(dest, name, 7)
		if !errors.Is(err, api.ErrBadInput) || api.ExitCode(err) != api.ExitFailed ||
			!strings.Contains(err.Error(), strconv.Quote(name)) || !strings.Contains(err.Error(), "give --out") {
			t.Errorf("mainPath(confined, %q) = %q, %v; want bad input naming it and --out", name, got, err)
		}
		_, err = framePaths(dest, 7, name, []string{"render/depth_0007.png"})
		if !errors.Is(err, api.ErrBadInput) {
			t.Errorf("framePaths(confined, %q) = %v; want the main file's refusal", name, err)
		}
	}
	for _, c := range []struct {
		pattern, name, want string
	}{
		{"", "//render/../plate_0007.png", filepath.Join(dir, "plate_0007.png")},
		{"", "//render/plate_0007.png", filepath.Join(dir, "render", "plate_0007.png")},
		{filepath.Join(root, "mine", "f_####"), "//../../escaped_0007.png", filepath.Join(root, "mine", "f_0007.png")},
	} {
		got, err := mainPath(outputDest{Pattern: c.pattern, Base: dir, Confined: true}, c.name, 7)
		if err != nil || got != c.want {
			t.Errorf("mainPath(confined, %q, %q) = %q, %v; want %q", c.pattern, c.name, got, err, c.want)
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		name      string
		err       error
		code      int
		stderrHas string
	}{
		{"nil", nil, api.ExitOK, ""},
		{"usage", usagef("want exactly one SCENE"), api.ExitUsage, "Run 'coordinator render --help'"},
		{"busy", fmt.Errorf("submitting: %w", api.ErrBusy), api.ExitBusy, "retry later"},
		{"busy with a time", fmt.Errorf("submitting: %w", &api.BusyError{Message: "farm busy", RetryAfter: 42 * time.Second}), api.ExitBusy, "retry in 42s"},
		{"unavailable", fmt.Errorf("%w at http://x: refused", api.ErrUnavailable), api.ExitBusy, "retry later"},
		{"canceled", fmt.Errorf("waiting: %w", context.Canceled), api.ExitInterrupt, "interrupted"},
		{"bad input", fmt.Errorf("%w: frame range 5-2 is reversed", api.ErrBadInput), api.ExitFailed, "reversed"},
		{"conflict", fmt.Errorf("%w: key k", api.ErrConflict), api.ExitFailed, "conflict"},
		{"other", errors.New("disk on fire"), api.ExitFailed, "disk on fire"},
	} {
		var stderr bytes.Buffer
		got := exitCode(&stderr, "coordinator render", c.err)
		if got != c.code {
			t.Errorf("%s: exitCode = %d, want %d", c.name, got, c.code)
		}
		switch {
		case c.err == nil:
			if stderr.Len() != 0 {
				t.Errorf("%s: printed %q, want nothing", c.name, stderr.String())
			}
		case !strings.HasPrefix(stderr.String(), "coordinator render: ") || !strings.Contains(stderr.String(), c.stderrHas):
			t.Errorf("%s: stderr %q, want it prefixed by the command and to contain %q", c.name, stderr.String(), c.stderrHas)
		}
	}
	// The contract's numbers themselves (docs/operations.md, Exit codes).
	if api.ExitOK != 0 || api.ExitFailed != 1 || api.ExitUsage != 2 || api.ExitInProgress != 3 || api.ExitQueued != 42 || api.ExitBusy != 75 || api.ExitInterrupt != 130 {
		t.Error("exit code constants drifted from the command contract")
	}
}

// Flags may come before or after positional arguments, and every kind of command-line mistake
// is a usage error (exit 2) naming the command, never a failure of the job.
func TestCommandLineParsing(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		has  string
	}{
		{"flag after positional", []string{"status", "job-1", "--server", "http://127.0.0.1:1"}, api.ExitBusy, "retry later"},
		{"flag before positional", []string{"status", "--server", "http://127.0.0.1:1", "job-1"}, api.ExitBusy, "retry later"},
		{"flag=value", []string{"status", "--server=http://127.0.0.1:1", "job-1"}, api.ExitBusy, "retry later"},
		{"unknown flag", []string{"status", "job-1", "--nope"}, api.ExitUsage, "unknown flag: --nope"},
		{"flag without value", []string{"submit", "s.json", "--frames"}, api.ExitUsage, "flag needs an argument"},
		{"bad flag value", []string{"render", "s.json", "--workers", "x"}, api.ExitUsage, "invalid argument"},
		{"missing positional", []string{"status"}, api.ExitUsage, "want exactly one JOB"},
		{"extra positional", []string{"jobs", "extra"}, api.ExitUsage, "unexpected argument"},
		{"unknown command", []string{"frobnicate"}, api.ExitUsage, "unknown command"},
		{"unknown subcommand", []string{"dlq", "purge"}, api.ExitUsage, "dlq"},
		{"bad log format", []string{"jobs", "--log-format", "xml", "--server", "http://127.0.0.1:1"}, api.ExitUsage, "--log-format \"xml\""},
		{"advertise without a scheme", []string{"serve", "--data", t.TempDir(), "--advertise", "render-1:7070"}, api.ExitUsage, "--advertise \"render-1:7070\""},
	} {
		code, _, stderr := run(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.has) {
			t.Errorf("%s: coordinator %q: exit %d, stderr %q; want %d and %q", c.name, c.args, code, stderr, c.code, c.has)
		}
		if c.code == api.ExitUsage && !strings.Contains(stderr, "--help' for usage") {
			t.Errorf("%s: a usage error without the hint: %q", c.name, stderr)
		}
	}
}

func TestCountReuse(t *testing.T) {
	st := api.Status{TilesCompleted: 10, TilesTotal: 12}
	countReuse(&st, 4)
	if st.TilesReused != 4 || st.TilesRendered != 6 {
		t.Errorf("countReuse = reused %d rendered %d, want 4, 6", st.TilesReused, st.TilesRendered)
	}
	st = api.Status{TilesCompleted: 2}
	countReuse(&st, 5) // should not happen, but must never go negative
	if st.TilesRendered != 0 {
		t.Errorf("rendered %d, want 0", st.TilesRendered)
	}
}

// --threads: the threads of a slot's renderer, given, or the cores divided among the slots
// (at least one); out of range is a usage error.
func TestThreadsFlag(t *testing.T) {
	cores := runtime.NumCPU()
	for _, tc := range []struct {
		args  []string
		slots int
		want  int
	}{
		{nil, 1, cores},
		{nil, cores, 1},
		{nil, cores * 4, 1},
		{[]string{"--threads", "3"}, 8, 3},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f := addThreadsFlag(fs, "tile slot")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if got, err := f.of(tc.slots); err != nil || got != tc.want {
			t.Errorf("%v with %d slots: %d, %v; want %d", tc.args, tc.slots, got, err, tc.want)
		}
	}
	for _, bad := range []string{"-1", "1025"} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f := addThreadsFlag(fs, "tile slot")
		if err := fs.Parse([]string{"--threads", bad}); err != nil {
			t.Fatal(err)
		}
		var ue *usageError
		if _, err := f.of(1); !errors.As(err, &ue) {
			t.Errorf("--threads %s: %v, want a usage error", bad, err)
		}
	}
}

// render's default --workers: one Blender process with every thread for a .blend (one copy of
// the scene, a whole frame on every core), one worker per core for other scenes.
func TestRenderDefaultWorkers(t *testing.T) {
	kf := kinds.AddFlags(pflag.NewFlagSet("t", pflag.ContinueOnError), false)
	dir := t.TempDir()
	blend, json := filepath.Join(dir, "shot.blend"), filepath.Join(dir, "scene.json")
	for _, p := range []string{blend, json} {
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := machineSlots(kf, blend); got != 1 {
		t.Errorf("a .blend: %d workers, want 1", got)
	}
	if got, want := machineSlots(kf, json), runtime.NumCPU(); got != want {
		t.Errorf("a JSON scene: %d workers, want %d", got, want)
	}
}
