package queue

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
)

func workerNames(t *testing.T, w *Workers) []string {
	t.Helper()
	ws, err := w.List(testCtx(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var names []string
	for _, x := range ws {
		names = append(names, x.Name)
	}
	return names
}

// Follow's copy of the worker directory says what the bucket says: a beat appears, a worker
// that leaves is gone at once, and one silent for WorkerTTL expires, as the bucket's own TTL
// removes it; without Follow, List reads the bucket and gives the same list.
func TestFollowedDirectoryIsTheBucketsList(t *testing.T) {
	t.Parallel()
	tf := startFarm(t, fastConfig())
	ctx := testCtx(t)
	w := tf.f.Workers
	for _, n := range []string{"b-worker", "a-worker"} {
		if err := w.Beat(ctx, api.Worker{Name: n, Slots: 2}); err != nil {
			t.Fatalf("Beat: %v", err)
		}
	}
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var beatsMu sync.Mutex
	var beaten []string
	go func() {
		done <- w.Follow(fctx, func(info api.Worker, at time.Time) {
			beatsMu.Lock()
			defer beatsMu.Unlock()
			beaten = append(beaten, info.Name)
		})
	}()
	following := func() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.following }
	eventually(t, 10*time.Second, "the watch to hold the bucket's values", following)
	if got := workerNames(t, w); !slices.Equal(got, []string{"a-worker", "b-worker"}) {
		t.Fatalf("followed List = %v, want both workers held before the watch began, by name", got)
	}
	if err := w.Beat(ctx, api.Worker{Name: "c-worker"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a new beat in the copy", func() bool { return slices.Contains(workerNames(t, w), "c-worker") })
	eventually(t, 10*time.Second, "c-worker's beat handed on", func() bool {
		beatsMu.Lock()
		defer beatsMu.Unlock()
		return len(beaten) >= 3
	})
	beatsMu.Lock()
	if len(beaten) != 3 || beaten[2] != "c-worker" || !slices.Contains(beaten, "a-worker") || !slices.Contains(beaten, "b-worker") {
		t.Fatalf("beats handed on = %v, want the two held, then c-worker's", beaten)
	}
	beatsMu.Unlock()
	if err := w.Leave(ctx, "a-worker"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a worker that left to leave the copy", func() bool { return !slices.Contains(workerNames(t, w), "a-worker") })

	// b-worker's last beat is older than the TTL: the bucket would have expired it.
	w.mu.Lock()
	e := w.beats[workerKey("b-worker")]
	e.at = time.Now().Add(-WorkerTTL - time.Second)
	w.beats[workerKey("b-worker")] = e
	w.mu.Unlock()
	if got := workerNames(t, w); !slices.Equal(got, []string{"c-worker"}) {
		t.Fatalf("followed List = %v, want c-worker alone (a-worker left, b-worker expired)", got)
	}

	stop()
	if err := <-done; err != nil {
		t.Fatalf("Follow: %v", err)
	}
	if following() {
		t.Fatal("the copy still counts as current after Follow returned")
	}
	if got := workerNames(t, w); !slices.Equal(got, []string{"b-worker", "c-worker"}) {
		t.Fatalf("List from the bucket = %v, want b-worker and c-worker (the bucket's TTL is 15 s, not yet passed)", got)
	}
}
