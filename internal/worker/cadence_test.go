package worker

import (
	"testing"
	"time"
)

// TestCadenceDue checks when each kind of checkpoint cadence makes a save due: after every
// pass, at a minimum interval, or automatically once the time since the last save is at
// least checkpointBudget times what a save costs on this worker.
func TestCadenceDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	cases := []struct {
		name  string
		every time.Duration // as Config takes it
		cost  time.Duration // the worker's last save
		after time.Duration // since the render began
		want  bool
	}{
		{"every pass, at once", -1, 50 * ms, 0, true},
		{"interval not yet", 2 * time.Second, 0, 1999 * ms, false},
		{"interval reached", 2 * time.Second, 0, 2 * time.Second, true},
		{"auto with free saves", 0, 0, 1 * ms, true},
		{"auto within the budget", 0, 2 * ms, checkpointBudget*2*ms - ms, false},
		{"auto past the budget", 0, 2 * ms, checkpointBudget * 2 * ms, true},
		{"auto on a slow store", 0, 100 * ms, time.Second, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var cost saveCost
			cost.set(c.cost)
			cd := newCadence(c.every, &cost, t0)
			if got := cd.due(t0.Add(c.after)); got != c.want {
				t.Errorf("due after %v (every %v, save cost %v) = %v, want %v", c.after, c.every, c.cost, got, c.want)
			}
		})
	}
}

// TestCadenceSavedMovesTheWindow checks that a save restarts the wait and that its cost, shared
// by the worker's tile runs, sets the next automatic wait.
func TestCadenceSavedMovesTheWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var cost saveCost
	a := newCadence(0, &cost, t0)
	if !a.due(t0) {
		t.Fatal("first automatic save with no known cost is not due")
	}
	a.saved(t0, t0.Add(10*time.Millisecond))
	end := t0.Add(10 * time.Millisecond)
	if a.due(end.Add(100 * time.Millisecond)) {
		t.Error("due 100ms after a save that took 10ms: the budget allows one every 190ms")
	}
	if !a.due(end.Add(190 * time.Millisecond)) {
		t.Error("not due 190ms after a save that took 10ms")
	}
	b := newCadence(0, &cost, end)
	if b.due(end.Add(100 * time.Millisecond)) {
		t.Error("another tile run of the worker ignored the cost it measured")
	}
}
