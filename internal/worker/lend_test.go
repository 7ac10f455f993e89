package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/layout"
)

// Property: a slot counts in its worker's idle slots once however often it finds no work, and
// leaves the count when it takes some; a tile gets its own threads times one plus the idle
// slots no other tile holds, and gives them back when its render ends.
func TestIdleSlotsCountOnceAndLendTheirThreads(t *testing.T) {
	var idle idleSlots
	var a, b idleSlot
	a.set(&idle, true)
	a.set(&idle, true)
	b.set(&idle, true)
	if idle.count() != 2 {
		t.Fatalf("two idle slots, one of them twice, count %d", idle.count())
	}
	one, other := &fakeThreads{threads: 2}, &fakeThreads{threads: 2}
	l, m := newLender(one, &idle), newLender(other, &idle)
	if n, lent := l.borrow(); n != 6 || !lent || one.threads != 6 {
		t.Fatalf("a 2-thread tile with 2 slots idle renders with %d (set %d), want 6", n, one.threads)
	}
	if n, lent := m.borrow(); n != 2 || lent {
		t.Fatalf("a second tile rendering meanwhile got %d threads: the idle slots were lent twice", n)
	}
	l.giveBack()
	m.giveBack()
	if n, _ := m.borrow(); n != 6 {
		t.Fatalf("after the first tile gave its slots back, the other's next borrow has %d threads, want 6", n)
	}
	m.giveBack()
	a.set(&idle, false)
	b.set(&idle, false)
	b.set(&idle, false)
	if n, lent := l.borrow(); idle.count() != 0 || n != 2 || lent {
		t.Fatalf("no slot idle: count %d, the tile renders with %d, want its own 2", idle.count(), n)
	}
	l.giveBack()
	var none *idleSlots // the assembly loop's: it lends nothing
	a.set(none, true)
	if n, _ := newLender(struct{}{}, &idle).borrow(); n != 0 || none.count() != 0 || none.borrow() != 0 {
		t.Fatal("a tile that cannot take threads was given some, or a nil count counted")
	}
}

type fakeThreads struct{ threads int }

func (f *fakeThreads) Threads() int     { return f.threads }
func (f *fakeThreads) SetThreads(n int) { f.threads = n }

// Property: a frame's only tile, taken while the worker's other slot finds no work, renders
// with that slot's threads too, on the real farm, and its pixels are the ones one thread
// renders (threads never change a pixel).
func TestIdleSlotLendsItsThreadsToTheTileRendering(t *testing.T) {
	h := newRunHarness(t)
	w, _ := h.worker(t, Config{Concurrency: 2, FetchWait: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); w.idle.count() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the worker's two slots never found the queue empty: %d idle", w.idle.count())
		}
		time.Sleep(10 * time.Millisecond)
	}
	job := h.job()
	h.publish(t, job)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if done, err := finalize.ManifestExists(h.ctx, h.objects, layout.TileManifestKey(job.FrameKey, job.TileKey)); err == nil && done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tile was never promoted:\n%s", h.logs.String())
		}
	}
	got := h.promoted(t, job)
	if !strings.Contains(h.logs.String(), "rendering with idle slots' threads too") || !strings.Contains(h.logs.String(), "threads=2") {
		t.Fatalf("the tile rendered on its own thread while the other slot idled:\n%s", h.logs.String())
	}
	samePixels(t, got, h.reference(t, job, h.st.SPP).Pixels())
}
