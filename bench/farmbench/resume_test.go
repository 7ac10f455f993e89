package farmbench

import (
	"math"
	"strings"
	"testing"
)

// resumeLog is a worker's log of the lines readResumeLogs reads, in the workers' text form.
func resumeLog(lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(`time=2026-12-03T13:04:40.500Z worker=w1 subject=tiles.render.p1.normal stream_seq=1 delivery=2 job_id=job-1 frame_key=f1 tile_key=t1 ` + l + "\n")
	}
	return b.String()
}

// TestReadResumeLogs reads the resumes and renders of three worker processes: one whose resume
// went on to render, one killed between its resume and its start event, and one that rendered
// a tile whole and found another already promoted.
func TestReadResumeLogs(t *testing.T) {
	logs := []string{
		resumeLog(
			`level=INFO msg="resuming from checkpoint" attempt_id=a1 fencing_token=3 samples_recovered=24`,
			`level=DEBUG msg="rendering tile" attempt_id=a1 fencing_token=3 frame=1 tile=0 rect="{X0:0 Y0:0 X1:32 Y1:32}" spp=64 samples_recovered=24`,
			`level=INFO msg="tile promoted" attempt_id=a1 fencing_token=3 frame=1 tile=0 rect="{X0:0 Y0:0 X1:32 Y1:32}" render_seconds=2.5 samples_recovered=24`,
		),
		resumeLog(
			`level=DEBUG msg="rendering tile" attempt_id=b1 fencing_token=4 frame=1 tile=1 spp=64 samples_recovered=0`,
			`level=INFO msg="tile promoted" attempt_id=b1 fencing_token=4 frame=1 tile=1 render_seconds=4 samples_recovered=0`,
			`level=INFO msg="resuming from checkpoint" attempt_id=b2 fencing_token=7 samples_recovered=30`,
		),
		resumeLog(
			`level=DEBUG msg="rendering tile" attempt_id=c1 fencing_token=5 frame=1 tile=2 spp=64 samples_recovered=0`,
			`level=INFO msg="tile promoted by another attempt first; this render was a duplicate" attempt_id=c1 fencing_token=5 frame=1 tile=2 render_seconds=4`,
		),
	}
	l := readResumeLogs(logs, 64)
	want := resumeLogs{resumes: 2, recovered: 54, started: 24, unstarted: 30, renderSeconds: 6.5, renderedSamples: 40 + 64}
	if l != want {
		t.Fatalf("read %+v, want %+v", l, want)
	}
	if got := l.renderSeconds / float64(l.renderedSamples); math.Abs(got-0.0625) > 1e-12 {
		t.Errorf("seconds a sample %v, want 0.0625", got)
	}
	// The coordinator heard of the first resume for certain and may have heard of the second.
	for recovered, ok := range map[int64]bool{24: true, 40: true, 54: true, 20: false, 60: false} {
		if l.explains(recovered) != ok {
			t.Errorf("explains(%d) = %v, want %v", recovered, !ok, ok)
		}
	}
	// Without a resume cut short, only the logged count itself is the coordinator's.
	l = readResumeLogs(logs[:1], 64)
	if l.unstarted != 0 || l.explains(20) || l.explains(30) {
		t.Errorf("%+v: want no resume cut short, and no other count explained", l)
	}
}

// TestResumeRunFigures checks the figures a run derives: the rate, the samples rendered again,
// the seconds a kill lost and a tile's length.
func TestResumeRunFigures(t *testing.T) {
	r := ResumeRun{Kills: 4, Needed: 640, Rendered: 680, Recovered: 360, SecondsPerSample: 0.0625, SPP: 64}
	if r.Again() != 40 || r.Rate() != 0.9 || r.SecondsLostPerKill() != 0.625 || r.TileSeconds() != 4 {
		t.Errorf("again %v, rate %v, lost a kill %v s, tile %v s; want 40, 0.9, 0.625, 4", r.Again(), r.Rate(), r.SecondsLostPerKill(), r.TileSeconds())
	}
	if r := (ResumeRun{SPP: 64}); r.Rate() != 1 || r.SecondsLostPerKill() != 0 || r.TileSeconds() != 0 {
		t.Errorf("no kill: rate %v, lost %v, tile %v; want 1, 0, 0", r.Rate(), r.SecondsLostPerKill(), r.TileSeconds())
	}
}
