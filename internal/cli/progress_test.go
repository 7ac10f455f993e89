package cli

import (
	"bytes"
	"testing"

	"github.com/tilefarm/tilefarm/internal/api"
)

// A job's bar follows samples when the coordinator counts them, so it moves during a long
// tile, and tiles otherwise.
func TestJobProgress(t *testing.T) {
	for _, c := range []struct {
		name        string
		st          api.Status
		done, total int64
		line        string
	}{
		{"tiles only", api.Status{TilesCompleted: 12, TilesTotal: 48, FramesCompleted: 1, FramesTotal: 3},
			12, 48, "12/48 tiles, 1/3 frames"},
		{"samples", api.Status{TilesCompleted: 12, TilesTotal: 48, FramesCompleted: 1, FramesTotal: 3, SamplesDone: 1800, SamplesTotal: 4800},
			1800, 4800, "37% samples, 12/48 tiles, 1/3 frames"},
		{"no samples yet", api.Status{TilesTotal: 4, FramesTotal: 1, SamplesTotal: 64},
			0, 64, "0% samples, 0/4 tiles, 0/1 frames"},
		{"almost is not all", api.Status{TilesCompleted: 3, TilesTotal: 4, FramesTotal: 1, SamplesDone: 999, SamplesTotal: 1000},
			999, 1000, "99% samples, 3/4 tiles, 0/1 frames"},
		{"all", api.Status{TilesCompleted: 4, TilesTotal: 4, FramesCompleted: 1, FramesTotal: 1, SamplesDone: 64, SamplesTotal: 64},
			64, 64, "100% samples, 4/4 tiles, 1/1 frames"},
		{"beyond total is capped", api.Status{TilesTotal: 4, FramesTotal: 1, SamplesDone: 70, SamplesTotal: 64},
			64, 64, "100% samples, 0/4 tiles, 0/1 frames"},
		{"negative is zero", api.Status{TilesTotal: 4, FramesTotal: 1, SamplesDone: -3, SamplesTotal: 64},
			0, 64, "0% samples, 0/4 tiles, 0/1 frames"},
	} {
		done, total, line := jobProgress(c.st)
		if done != c.done || total != c.total || line != c.line {
			t.Errorf("%s: jobProgress = %d, %d, %q; want %d, %d, %q", c.name, done, total, line, c.done, c.total, c.line)
		}
	}
}

func TestBar(t *testing.T) {
	for _, c := range []struct {
		done, total int64
		want        string
	}{
		{0, 0, ".........."},
		{0, 10, ".........."},
		{37, 100, "###......."},
		{99, 100, "#########."},
		{100, 100, "##########"},
		{150, 100, "##########"},
		{-5, 100, ".........."},
		{1 << 40, 1 << 41, "#####....."},
	} {
		if got := bar(c.done, c.total, 10); got != c.want {
			t.Errorf("bar(%d, %d) = %q, want %q", c.done, c.total, got, c.want)
		}
	}
}

// On a terminal the bar redraws its line; elsewhere a line is printed only when it changed.
func TestProgressLines(t *testing.T) {
	var w bytes.Buffer
	p := &progress{w: &w, tty: true}
	p.show(jobProgress(api.Status{TilesCompleted: 12, TilesTotal: 48, FramesCompleted: 1, FramesTotal: 3, SamplesDone: 1800, SamplesTotal: 4800}))
	if want := "\r[###########...................] 37% samples, 12/48 tiles, 1/3 frames\x1b[K"; w.String() != want {
		t.Fatalf("terminal line %q, want %q", w.String(), want)
	}
	p.show(jobProgress(api.Status{TilesCompleted: 12, TilesTotal: 48, FramesCompleted: 1, FramesTotal: 3, SamplesDone: 1800, SamplesTotal: 4800}))
	p.update(3, 4, "tiles") // the tileworker's bar
	if want := "\r[######################........] 3/4 tiles\x1b[K"; w.String()[w.Len()-len(want):] != want || bytes.Count(w.Bytes(), []byte("\r")) != 2 {
		t.Fatalf("terminal output %q: want one redraw per change, the last %q", w.String(), want)
	}

	w.Reset()
	p = &progress{w: &w}
	p.show(jobProgress(api.Status{TilesTotal: 4, FramesTotal: 1, SamplesTotal: 64, SamplesDone: 8}))
	p.show(jobProgress(api.Status{TilesTotal: 4, FramesTotal: 1, SamplesTotal: 64, SamplesDone: 9})) // within 2 s: skipped
	p.show(jobProgress(api.Status{TilesCompleted: 4, TilesTotal: 4, FramesCompleted: 1, FramesTotal: 1, SamplesTotal: 64, SamplesDone: 64}))
	if want := "12% samples, 0/4 tiles, 0/1 frames\n100% samples, 4/4 tiles, 1/1 frames\n"; w.String() != want {
		t.Fatalf("log lines %q, want %q", w.String(), want)
	}
}
