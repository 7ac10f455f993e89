package worker

import (
	"testing"
	"time"
)

// TestCadenceDue checks when each kind of checkpoint cadence makes a save due: after every
// pass, at a minimum interval, or automatically once the time since the last save is at
// least checkpointBudget times what a save costs the render, and its size over checkpointRate,
// on this worker.
func TestCadenceDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	cases := []struct {
		name  string
		every time.Duration // as Config takes it
		cost  time.Duration // the worker's last save: its render share
		size  int           // and its encoded size
		after time.Duration // since the render began
		want  bool
	}{
		{"every pass, at once", -1, 50 * ms, 1 << 30, 0, true},
		{"interval not yet", 2 * time.Second, 0, 0, 1999 * ms, false},
		{"interval reached", 2 * time.Second, 0, 0, 2 * time.Second, true},
		{"auto with free saves", 0, 0, 0, 1 * ms, true},
		{"auto within the render budget", 0, 2 * ms, 1000, checkpointBudget*2*ms - ms, false},
		{"auto past the render budget", 0, 2 * ms, 1000, checkpointBudget * 2 * ms, true},
		{"auto with a large state, too soon", 0, 1 * ms, checkpointRate / 4, 249 * ms, false},
		{"auto with a large state, in time", 0, 1 * ms, checkpointRate / 4, 250 * ms, true},
		{"auto on a slow encoder", 0, 100 * ms, 1000, time.Second, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var cost saveCost
			cost.set(c.cost, c.size)
			cd := newCadence(c.every, &cost, t0)
			if got := cd.due(t0.Add(c.after)); got != c.want {
				t.Errorf("due after %v (every %v, save cost %v) = %v, want %v", c.after, c.every, c.cost, got, c.want)
			}
		})
	}
}

// TestCadenceMarkMovesTheWindow checks that a save restarts the wait and that its cost, shared
// by the worker's tile runs, sets the next automatic wait.
func TestCadenceMarkMovesTheWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	var cost saveCost
	a := newCadence(0, &cost, t0)
	if !a.due(t0) {
		t.Fatal("first automatic save with no known cost is not due")
	}
	a.mark(t0)
	cost.set(2*ms, 1000)
	if a.due(t0.Add(checkpointBudget*2*ms - ms)) {
		t.Errorf("due %v after a save that cost 2ms: the budget allows one every %v", checkpointBudget*2*ms-ms, checkpointBudget*2*ms)
	}
	if !a.due(t0.Add(checkpointBudget * 2 * ms)) {
		t.Errorf("not due %v after a save that cost 2ms", checkpointBudget*2*ms)
	}
	b := newCadence(0, &cost, t0)
	if b.due(t0.Add(50 * ms)) {
		t.Error("another tile run of the worker ignored the cost it measured")
	}
}
