package coordinator

import (
	"slices"
	"testing"
)

// TestTakeReadyTakesWhatArrivedAndNeverWaits: a batch is the first event and everything that
// already arrived, up to the limit; with nothing more on the channel (open, no sender) it
// returns at once instead of waiting for company, so a frame's last tile.completed is applied,
// and its assembly asked for, without delay (docs/design.md, "Flows": Events).
func TestTakeReadyTakesWhatArrivedAndNeverWaits(t *testing.T) {
	idle := make(chan int) // open and never written: waiting on it would hang the test
	if got := takeReady(1, idle, eventBatch); !slices.Equal(got, []int{1}) {
		t.Fatalf("lone event: batch %v, want [1]", got)
	}

	ready := make(chan int, 10)
	for i := 2; i <= 6; i++ {
		ready <- i
	}
	if got := takeReady(1, ready, 4); !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Fatalf("limit 4: batch %v, want [1 2 3 4]", got)
	}
	if got := takeReady(0, ready, eventBatch); !slices.Equal(got, []int{0, 5, 6}) {
		t.Fatalf("the rest: batch %v, want [0 5 6]", got)
	}

	closed := make(chan int, 1)
	closed <- 2
	close(closed)
	if got := takeReady(1, closed, eventBatch); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("closed channel: batch %v, want [1 2]", got)
	}
}
