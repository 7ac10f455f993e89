package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coordinator"
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
		if !errors.Is(err, coordinator.ErrBadInput) || errors.As(err, &ue) {
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

func TestFormatFor(t *testing.T) {
	for _, c := range []struct{ flag, out, want string }{
		{"", "out/a_####.png", "png"},
		{"", "out/a_####.exr", "exr"},
		{"", "out/a_####.EXR", "exr"},
		{"", "out/a_####", "png"},
		{"png16", "out/a_####.png", "png16"},
		{"exr", "out/a_####.png", "exr"}, // an explicit flag wins over the extension
		{"png", "out/a_####.exr", "png"},
	} {
		got, err := formatFor(c.flag, c.out)
		if err != nil || got != c.want {
			t.Errorf("formatFor(%q, %q) = %q, %v; want %q", c.flag, c.out, got, err, c.want)
		}
	}
	for _, f := range []string{"jpg", "PNG", "tiff"} {
		_, err := formatFor(f, "x.png")
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), f) {
			t.Errorf("formatFor(%q) = %v, want a usage error naming it", f, err)
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
		{"nil", nil, ExitOK, ""},
		{"usage", usagef("want exactly one SCENE"), ExitUsage, "Run 'coordinator render -h'"},
		{"help", flag.ErrHelp, ExitOK, ""},
		{"busy", fmt.Errorf("submitting: %w", coordinator.ErrBusy), ExitBusy, "retry later"},
		{"unavailable", fmt.Errorf("%w at http://x: refused", client.ErrUnavailable), ExitBusy, "retry later"},
		{"canceled", fmt.Errorf("waiting: %w", context.Canceled), ExitInterrupt, "interrupted"},
		{"bad input", fmt.Errorf("%w: frame range 5-2 is reversed", coordinator.ErrBadInput), ExitFailed, "reversed"},
		{"conflict", fmt.Errorf("%w: key k", coordinator.ErrConflict), ExitFailed, "conflict"},
		{"other", errors.New("disk on fire"), ExitFailed, "disk on fire"},
	} {
		var stderr bytes.Buffer
		got := exitCode(&stderr, "coordinator render", c.err)
		if got != c.code {
			t.Errorf("%s: exitCode = %d, want %d", c.name, got, c.code)
		}
		switch {
		case c.err == nil || errors.Is(c.err, flag.ErrHelp):
			if stderr.Len() != 0 {
				t.Errorf("%s: printed %q, want nothing (the flag package already printed usage)", c.name, stderr.String())
			}
		case !strings.HasPrefix(stderr.String(), "coordinator render: ") || !strings.Contains(stderr.String(), c.stderrHas):
			t.Errorf("%s: stderr %q, want it prefixed by the command and to contain %q", c.name, stderr.String(), c.stderrHas)
		}
	}
	// The contract's numbers themselves (docs/operations.md, Exit codes).
	if ExitOK != 0 || ExitFailed != 1 || ExitUsage != 2 || ExitInProgress != 3 || ExitQueued != 42 || ExitBusy != 75 || ExitInterrupt != 130 {
		t.Error("exit code constants drifted from the command contract")
	}
}

func TestParseArgsFlagsAfterPositionals(t *testing.T) {
	newFS := func() (*flag.FlagSet, *int, *bool, *string) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return fs, fs.Int("n", 0, ""), fs.Bool("v", false, ""), fs.String("out", "", "")
	}
	fs, n, v, out := newFS()
	pos, err := parseArgs(fs, []string{"scene.json", "--n", "3", "second", "-v", "--out=o_####.png"})
	if err != nil {
		t.Fatalf("parseArgs: %v", err)
	}
	if strings.Join(pos, " ") != "scene.json second" || *n != 3 || !*v || *out != "o_####.png" {
		t.Errorf("parseArgs = %q n=%d v=%v out=%q", pos, *n, *v, *out)
	}

	fs, n, _, _ = newFS()
	pos, err = parseArgs(fs, []string{"-n", "4", "a"})
	if err != nil || len(pos) != 1 || pos[0] != "a" || *n != 4 {
		t.Errorf("flags first: %q n=%d err=%v", pos, *n, err)
	}

	fs, _, _, _ = newFS()
	if pos, err := parseArgs(fs, nil); err != nil || len(pos) != 0 {
		t.Errorf("no args: %q, %v", pos, err)
	}

	for _, args := range [][]string{{"a", "--nope"}, {"a", "-n"}, {"-n", "x", "a"}} {
		fs, _, _, _ = newFS()
		_, err := parseArgs(fs, args)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("parseArgs(%q) = %v, want a usage error", args, err)
		}
	}
	fs, _, _, _ = newFS()
	if _, err := parseArgs(fs, []string{"a", "-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("parseArgs(-h) = %v, want flag.ErrHelp", err)
	}
}

func TestCountReuse(t *testing.T) {
	st := coordinator.Status{TilesCompleted: 10, TilesTotal: 12}
	countReuse(&st, 4)
	if st.TilesReused != 4 || st.TilesRendered != 6 {
		t.Errorf("countReuse = reused %d rendered %d, want 4, 6", st.TilesReused, st.TilesRendered)
	}
	st = coordinator.Status{TilesCompleted: 2}
	countReuse(&st, 5) // should not happen, but must never go negative
	if st.TilesRendered != 0 {
		t.Errorf("rendered %d, want 0", st.TilesRendered)
	}
}
