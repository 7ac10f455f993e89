package farmbench

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// TestRunTiny runs every measurement at tiny sizes, with objects in MinIO, and checks the JSON
// has every figure as a finite number. No time is asserted: the figures only have to exist. A
// missing MinIO binary fails the run (miniotest names the way to install it); it never skips.
func TestRunTiny(t *testing.T) {
	t.Parallel() // a farm and directory of its own; no figure is held to a value
	c := Default()
	c.Dir = t.TempDir()
	c.MinIO = true
	c.Shot = Shot{First: 1, Last: 1, Width: 96, Height: 54, SPP: 2, TileSize: 32}
	c.SmallFrames = 1
	c.Overhead = Shot{First: 1, Last: 1, Width: 48, Height: 27, SPP: 1, TileSize: 16}
	c.DispatchFrames = 2
	c.RecoveryReps = 1
	c.RecoveryServe = []string{"--ack-wait", "2s", "--lease-ttl", "2s"}
	c.ResumeKills, c.ResumeFrames, c.ResumeTileSeconds = 1, 1, 0.4
	c.RSSTiles = 100
	c.ProfileDir, c.ProfileDuration = t.TempDir(), time.Second
	res, err := Run(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Figures() {
		name := f[0].(string)
		v, ok := got[name].(float64)
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("%s = %v in the JSON, want a finite number", name, got[name])
		}
	}
	for name := range Targets {
		if _, ok := got[name]; !ok {
			t.Errorf("no %s in the JSON", name)
		}
	}
	if err := res.Finite(); err != nil {
		t.Error(err)
	}
	// A tile's length and the seconds a kill lost come from the workers' logs: a length of 0
	// means no line was read.
	if res.ResumeTileSeconds <= 0 || res.ResumeSecondsLost < 0 {
		t.Errorf("resume_tile_seconds %v, resume_seconds_lost_per_kill %v: want a length read from the logs", res.ResumeTileSeconds, res.ResumeSecondsLost)
	}
	// The factors come from the workers' metrics and the local renders' rusage. A slot renders
	// one tile at a time, so the farm's rendering never exceeds its slots' time (slot_busy <= 1).
	for _, e := range []struct {
		name    string
		factors map[string]float64
	}{{"farm_efficiency", res.FarmEfficiencyFactors}, {"farm_efficiency_small", res.FarmEfficiencySmallFactors}} {
		busy, slow, local := e.factors["slot_busy"], e.factors["render_slowdown"], e.factors["local_busy"]
		if !(busy > 0 && busy <= 1 && slow > 0 && local > 0) {
			t.Errorf("%s factors %v, want each above 0 and slot_busy at most 1", e.name, e.factors)
		}
	}
	var table strings.Builder
	res.Table(&table)
	if !strings.Contains(table.String(), "farm_efficiency") {
		t.Errorf("table without farm_efficiency:\n%s", table.String())
	}
}

// TestMonitorTiny runs the monitor step at a tiny size (2 jobs of 4 frames, 1 s windows) and
// checks every window measured the coordinator's CPU as a finite, non-negative number, with
// the tile events flowing. No figure is held to a value: that is the full run's to report.
func TestMonitorTiny(t *testing.T) {
	t.Parallel() // a farm and directory of its own; no figure is held to a value
	c := Default()
	c.Dir = t.TempDir()
	c.Only = []string{"monitor"}
	c.Monitor = MonitorLoad{Jobs: 2, Frames: 4, Width: 128, Height: 64, TileSize: 64, Rate: 4, Window: time.Second, Rounds: 1}
	res, err := Run(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	m := res.Monitor
	if m == nil || len(m.Windows) != 3 || m.Tiles != 16 || m.EventsPerS <= 0 {
		t.Fatalf("monitor = %+v, want three windows over 16 tiles with events flowing", m)
	}
	for _, w := range m.Windows {
		if math.IsNaN(w.Cores) || math.IsInf(w.Cores, 0) || w.Cores < 0 {
			t.Errorf("window %+v: want finite, non-negative cores", w)
		}
	}
}
