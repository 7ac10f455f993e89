//go:build unix

package blender_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/render"
)

// onePid returns the pool's only idle process.
func onePid(t *testing.T, pool *blender.Pool) int {
	t.Helper()
	pids := pool.IdlePIDs()
	if len(pids) != 1 {
		t.Fatalf("pool has %d idle processes, want 1", len(pids))
	}
	return pids[0]
}

func gone(pid int) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// Property: a Blender process that dies is replaced on the next request; the tile renders.
func TestPoolReplacesADeadProcess(t *testing.T) {
	pool := blendertest.Pool(t, 1)
	sc := loadExample(t, pool)
	st := settings(t, sc, 64, 48, 2, 1)
	r := render.Rect{X1: 16, Y1: 16}
	want := renderTile(t, pool, sc, st, 1, r)
	pid := onePid(t, pool)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !gone(pid) {
		t.Fatal("killed Blender still runs")
	}
	if got := renderTile(t, pool, sc, st, 1, r); !equal(got, want) {
		t.Fatal("the tile rendered on a restarted process differs")
	}
	if p := onePid(t, pool); p == pid {
		t.Fatal("the dead process was reused")
	}
}

// Property: a Blender process that stops answering (frozen here with SIGSTOP) is killed after
// the hang timeout and replaced; the request fails with ErrProcess, retryable.
func TestPoolKillsAHungProcess(t *testing.T) {
	pool := blender.NewPool(blender.Options{Binary: blendertest.Binary(t), Dir: t.TempDir(), HangTimeout: 3 * time.Second})
	t.Cleanup(func() { pool.Close() })
	sc := loadExample(t, pool)
	st := settings(t, sc, 64, 48, 2, 1)
	r := render.Rect{X1: 16, Y1: 16}
	renderTile(t, pool, sc, st, 1, r)
	pid := onePid(t, pool)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	tile, err := blender.NewTile(context.Background(), pool, sc, st, 1, r)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = tile.Render(context.Background(), 0, 2)
	if !errors.Is(err, blender.ErrProcess) || !strings.Contains(err.Error(), "no sign of life") {
		t.Fatalf("render on a frozen process: %v, want ErrProcess naming the hang", err)
	}
	// The error carries what Blender printed last, for the failed attempt's record.
	var out *blender.OutputError
	if !errors.As(err, &out) {
		t.Fatalf("the hang's error %v carries no Blender output", err)
	}
	if !slices.ContainsFunc(out.Output, func(l string) bool { return strings.Contains(l, "Saved: ") }) {
		t.Fatalf("the hang's error carries Blender's output %q, want its last lines (the pass it saved before it froze)", out.Output)
	}
	if time.Since(start) < 3*time.Second {
		t.Fatalf("gave up after %v, before the hang timeout", time.Since(start))
	}
	if !gone(pid) {
		t.Fatal("the hung Blender was not killed")
	}
	renderTile(t, pool, sc, st, 1, r)
}

// Property: cancelling a render stops it at once (the process is killed, since Cycles cannot
// be interrupted otherwise) and leaves the tile at its last complete pass.
func TestCancelKillsTheRender(t *testing.T) {
	pool := blendertest.Pool(t, 1)
	sc := loadExample(t, pool)
	st := settings(t, sc, 160, 120, 4000, 2)
	renderTile(t, pool, sc, settings(t, sc, 16, 16, 1, 1), 1, render.Rect{X1: 16, Y1: 16})
	pid := onePid(t, pool)
	tile, err := blender.NewTile(context.Background(), pool, sc, st, 1, render.Rect{X1: 160, Y1: 120})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(2*time.Second, cancel) // the pass takes far longer
	start := time.Now()
	err = tile.Render(ctx, 0, 2000)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled render: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	if tile.Next() != 0 {
		t.Fatalf("tile at sample %d after a cancelled first pass, want 0", tile.Next())
	}
	if !gone(pid) {
		t.Fatal("the cancelled render's Blender still runs")
	}
}

// Property: Warm brings the pool to its size in the background, and later requests use those
// processes instead of starting more.
func TestWarmStartsTheWholePool(t *testing.T) {
	pool := blendertest.Pool(t, 2)
	sc := loadExample(t, pool) // inspecting starts one process
	pool.Warm(context.Background())
	deadline := time.Now().Add(time.Minute)
	for len(pool.IdlePIDs()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle processes a minute after Warm, want 2", len(pool.IdlePIDs()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := pool.IdlePIDs()
	pool.Warm(context.Background()) // nothing to add
	st := settings(t, sc, 64, 48, 2, 1)
	errs := make(chan error, 2)
	for _, r := range []render.Rect{{X1: 32, Y1: 48}, {X0: 32, X1: 64, Y1: 48}} {
		go func() {
			tile, err := blender.NewTile(context.Background(), pool, sc, st, 1, r)
			if err == nil {
				err = tile.Render(context.Background(), 0, 2)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	after := pool.IdlePIDs()
	if len(after) != 2 || !slices.Contains(before, after[0]) || !slices.Contains(before, after[1]) {
		t.Fatalf("processes %v after two renders, want the warmed %v", after, before)
	}
}
