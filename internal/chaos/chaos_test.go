//go:build unix

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/faults"
)

// logWriter sends the harness's progress to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// The CI schedule: every seam of the Render and Finalize flows, the frozen worker, the
// coordinator killed at each of its seams, NATS and MinIO nodes restarted, outages and a
// seeded random schedule, each on real processes. Every fault must hit work in progress, and
// every job must end complete, unfailed and equal to the reference pixel for pixel.
func TestCISchedule(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cfg := config{dir: t.TempDir(), seed: 1, outage: 15 * time.Second, log: logWriter{t}}
	rows, err := runSchedule(ctx, cfg)
	var table strings.Builder
	printTable(&table, rows)
	t.Logf("chaos table:\n%s", table.String())
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(rows))
	for _, r := range rows {
		names = append(names, r.Scenario)
		if !r.OK {
			t.Errorf("%s: %s", r.Scenario, r.Problem)
		}
	}
	all := strings.Join(names, "\n")
	for _, seam := range faults.WorkerSeams {
		if !strings.Contains(all, "worker killed at "+seam+"\n") && !strings.HasSuffix(all, "worker killed at "+seam) {
			t.Errorf("the schedule does not cover the %s seam", seam)
		}
	}
	for _, want := range []string{"frozen", "during submit", "during relay", "applying events", "stream leader", "MinIO node",
		"single NATS server", "NATS outage", "storage outage", "random faults"} {
		if !strings.Contains(all, want) {
			t.Errorf("the schedule has no scenario for %q", want)
		}
	}
}
