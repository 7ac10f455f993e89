package faults

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tilefarm/tilefarm/render"
)

// Flags are a Plan as the hidden --fault-* flags of a command, read when it runs.
type Flags struct {
	seams               []string
	crash, panic, fail  string
	slow                string
	passDelay, smpDelay time.Duration
	deaf                string
}

// AddFlags adds the fault flags to fs, hidden from help since they exist for the fault tests:
// the same in every command that runs a part of the farm, with the crash seams the process has.
func AddFlags(fs *pflag.FlagSet, seams []string) *Flags {
	f := &Flags{seams: seams}
	fs.StringVar(&f.crash, "fault-crash", "", "testing only: kill -9 this process at a seam: "+strings.Join(seams, ", "))
	fs.StringVar(&f.panic, "fault-panic-tile", "", "testing only: panic in every attempt at the tile FRAME:X0,Y0,X1,Y1")
	fs.StringVar(&f.slow, "fault-slow-tile", "", "testing only: FRAME:X0,Y0,X1,Y1:DURATION sleeps DURATION after each pass of that tile")
	fs.DurationVar(&f.passDelay, "fault-pass-delay", 0, "testing only: sleep after each pass")
	fs.DurationVar(&f.smpDelay, "fault-sample-delay", 0, "testing only: sleep before each sample, rendering and counting samples one at a time")
	fs.StringVar(&f.fail, "fault-fail-publish", "", "testing only: TYPE:N fails the first N publishes of events of TYPE (e.g. tile.completed:3)")
	fs.StringVar(&f.deaf, "fault-deaf-leader", "", "testing only: AFTER:FOR stops renewing and reading the leadership lease AFTER the first term began, FOR that long, while the leader acts on")
	for _, name := range []string{"fault-crash", "fault-panic-tile", "fault-slow-tile", "fault-pass-delay", "fault-sample-delay", "fault-fail-publish", "fault-deaf-leader"} {
		_ = fs.MarkHidden(name) // the flag exists: cannot fail
	}
	return f
}

// Plan is the plan the flags were given, killing the process with kill; its error names the
// flag that is wrong.
func (f *Flags) Plan(kill func(seam string)) (Plan, error) {
	p := Plan{Crash: f.crash, Kill: kill, PassDelay: f.passDelay, SampleDelay: f.smpDelay}
	if p.Crash != "" && !slices.Contains(f.seams, p.Crash) {
		return Plan{}, fmt.Errorf("--fault-crash %q: want one of %s", p.Crash, strings.Join(f.seams, ", "))
	}
	if f.fail != "" {
		typ, n, ok := strings.Cut(f.fail, ":")
		count, err := strconv.Atoi(n)
		if !ok || err != nil || count < 1 {
			return Plan{}, fmt.Errorf("--fault-fail-publish %q: want TYPE:N, e.g. tile.completed:3", f.fail)
		}
		p.FailPublish, p.FailPublishN = typ, count
	}
	if f.panic != "" {
		fr, rect, _ := strings.Cut(f.panic, ":")
		n, err := strconv.Atoi(fr)
		if err != nil {
			return Plan{}, fmt.Errorf("--fault-panic-tile %q: want FRAME:X0,Y0,X1,Y1", f.panic)
		}
		r, err := parseRect(rect)
		if err != nil {
			return Plan{}, err
		}
		p.PanicTile = &TileAt{Frame: n, Rect: r}
	}
	if f.deaf != "" {
		after, span, ok := strings.Cut(f.deaf, ":")
		a, err1 := time.ParseDuration(after)
		d, err2 := time.ParseDuration(span)
		if !ok || err1 != nil || err2 != nil || a < 0 || d <= 0 {
			return Plan{}, fmt.Errorf("--fault-deaf-leader %q: want AFTER:FOR, e.g. 4s:12s", f.deaf)
		}
		p.DeafLeaderAfter, p.DeafLeaderFor = a, d
	}
	if f.slow != "" {
		bad := fmt.Errorf("--fault-slow-tile %q: want FRAME:X0,Y0,X1,Y1:DURATION, e.g. 1:0,0,32,32:500ms", f.slow)
		fr, rest, ok := strings.Cut(f.slow, ":")
		rect, delay, ok2 := strings.Cut(rest, ":")
		n, err := strconv.Atoi(fr)
		if !ok || !ok2 || err != nil {
			return Plan{}, bad
		}
		r, err := parseRect(rect)
		if err != nil {
			return Plan{}, bad
		}
		d, err := time.ParseDuration(delay)
		if err != nil || d <= 0 {
			return Plan{}, bad
		}
		p.SlowTile, p.SlowTileDelay = &TileAt{Frame: n, Rect: r}, d
	}
	return p, nil
}

func parseRect(s string) (render.Rect, error) {
	parts := strings.Split(s, ",")
	if len(parts) != 4 {
		return render.Rect{}, fmt.Errorf("rectangle %q: want X0,Y0,X1,Y1", s)
	}
	var v [4]int
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return render.Rect{}, fmt.Errorf("rectangle %q: want X0,Y0,X1,Y1", s)
		}
		v[i] = n
	}
	return render.Rect{X0: v[0], Y0: v[1], X1: v[2], Y1: v[3]}, nil
}
