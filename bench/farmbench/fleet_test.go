package farmbench

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// TestFleetTiny runs the fleet step at tiny sizes (2 and 4 simulated workers, 50 ms tiles,
// about two seconds of work each) and checks its JSON: a row per size with every figure, each a
// finite number, and sane ones. No speed is asserted beyond the fleet having rendered: the
// figures only have to exist and agree with each other. A missing nats-server fails the test
// (natstest names the way to build it); it never skips.
func TestFleetTiny(t *testing.T) {
	t.Parallel() // a farm and directory of its own; no figure is held to a value
	c := Default()
	c.Dir = t.TempDir()
	c.Only = []string{"fleet"}
	// Nice 1, not the default 10: beside the rest of the test command on two cores, hosts at
	// nice 10 get a tenth of a core and the fleet's job outlasts its time limit.
	c.Fleet = FleetConfig{Sizes: []int{2, 4}, TileSeconds: 0.05, WorkSeconds: 2, FrameTiles: 4, SampleEvery: 50 * time.Millisecond, Nice: 1}
	c.ProfileDir, c.ProfileDuration = t.TempDir(), time.Second
	res, err := Run(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Fleet      []map[string]any `json:"fleet"`
		Saturation *float64         `json:"fleet_saturation_workers"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Fleet) != len(c.Fleet.Sizes) {
		t.Fatalf("%d fleet rows in the JSON, want %d:\n%s", len(got.Fleet), len(c.Fleet.Sizes), raw)
	}
	if got.Saturation == nil {
		t.Error("no fleet_saturation_workers in the JSON")
	}
	figures := []string{"workers", "tiles_per_s", "ideal_tiles_per_s", "events_per_s", "dispatch_p50_ms", "dispatch_p99_ms",
		"coordinator_cpu_cores", "jetstream_cpu_cores", "workers_cpu_cores", "nats_msgs_in_per_s", "lease_writes_per_s",
		"heartbeat_msgs_per_s", "tiles", "tiles_completed", "duration_s", "window_s", "dispatch_samples", "leases_lost",
		"leases_expired_on_worker_clock", "lease_renewal_timeouts", "pulls_refused_max_waiting"}
	for i, row := range got.Fleet {
		num := map[string]float64{}
		for _, name := range figures {
			v, ok := row[name].(float64)
			if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
				t.Errorf("fleet[%d].%s = %v, want a finite number", i, name, row[name])
			}
			num[name] = v
		}
		if want := float64(c.Fleet.Sizes[i]); num["workers"] != want {
			t.Errorf("fleet[%d] has %v workers, want %v", i, num["workers"], want)
		}
		if row["job_state"] != "completed" || num["tiles_completed"] != num["tiles"] {
			t.Errorf("fleet[%d]: job %v with %v of %v tiles, want completed with all of them", i, row["job_state"], num["tiles_completed"], num["tiles"])
		}
		if !(num["tiles_per_s"] > 0 && num["tiles_per_s"] <= 1.5*num["ideal_tiles_per_s"]) {
			t.Errorf("fleet[%d]: %v tiles/s, want above 0 and not far above the ideal %v", i, num["tiles_per_s"], num["ideal_tiles_per_s"])
		}
		if !(num["events_per_s"] > 0 && num["dispatch_samples"] > 0 && num["window_s"] > 0) {
			t.Errorf("fleet[%d]: %v events/s and %v dispatch samples over %v s, want them all above 0", i, num["events_per_s"], num["dispatch_samples"], num["window_s"])
		}
		if !(num["dispatch_p50_ms"] >= 0 && num["dispatch_p50_ms"] <= num["dispatch_p99_ms"]) {
			t.Errorf("fleet[%d]: dispatch p50 %v ms, p99 %v ms: want 0 <= p50 <= p99", i, num["dispatch_p50_ms"], num["dispatch_p99_ms"])
		}
		for _, cpu := range []string{"coordinator_cpu_cores", "jetstream_cpu_cores", "workers_cpu_cores"} {
			if num[cpu] < 0 {
				t.Errorf("fleet[%d].%s = %v, want at least 0", i, cpu, num[cpu])
			}
		}
		if profs, _ := row["profiles"].([]any); len(profs) != 2 {
			t.Errorf("fleet[%d]: profiles %v, want the coordinator's and the nats-server's", i, row["profiles"])
		}
	}
	var table strings.Builder
	res.Table(&table)
	if !strings.Contains(table.String(), "fleet:") {
		t.Errorf("table without the fleet:\n%s", table.String())
	}
}
