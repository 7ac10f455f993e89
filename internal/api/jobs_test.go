package api

import "testing"

// Every job state's exit code and whether a waiter stops at it, one row each (the command
// contract, docs/operations.md): waiting is accepted and queued, blocked fails with its reason.
func TestJobStateExitCodes(t *testing.T) {
	for _, row := range []struct {
		state    JobState
		exit     int
		finished bool
	}{
		{JobQueued, ExitQueued, false},
		{JobWaiting, ExitQueued, false},
		{JobRendering, ExitInProgress, false},
		{JobCompleted, ExitOK, true},
		{JobFailed, ExitFailed, true},
		{JobBlocked, ExitFailed, true},
		{JobCancelled, ExitFailed, true},
	} {
		if got := row.state.ExitCode(); got != row.exit {
			t.Errorf("%s: exit %d, want %d", row.state, got, row.exit)
		}
		if got := row.state.Finished(); got != row.finished {
			t.Errorf("%s: finished %v, want %v", row.state, got, row.finished)
		}
	}
}
