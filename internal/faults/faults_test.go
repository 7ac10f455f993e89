package faults

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/render"
)

var quiet = slog.New(slog.DiscardHandler)

// The flags make the plan both commands run with, and refuse what no process could do.
func TestFlagsMakeThePlan(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	f := AddFlags(fs, WorkerSeams)
	if err := fs.Parse([]string{"--fault-crash", MidPass, "--fault-panic-tile", "8:32,0,64,32", "--fault-pass-delay", "40ms",
		"--fault-fail-publish", "tile.completed:3", "--fault-slow-tile", "2:0,32,32,64:250ms"}); err != nil {
		t.Fatal(err)
	}
	p, err := f.Plan(func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	if p.Crash != MidPass || p.PanicTile == nil || *p.PanicTile != (TileAt{8, render.Rect{X0: 32, Y0: 0, X1: 64, Y1: 32}}) ||
		p.PassDelay != 40*time.Millisecond || p.FailPublish != "tile.completed" || p.FailPublishN != 3 ||
		p.SlowTile == nil || *p.SlowTile != (TileAt{2, render.Rect{X0: 0, Y0: 32, X1: 32, Y1: 64}}) || p.SlowTileDelay != 250*time.Millisecond {
		t.Fatalf("plan %+v", p)
	}
	for _, flag := range []string{"fault-crash", "fault-pass-delay", "fault-slow-tile"} {
		if !fs.Lookup(flag).Hidden {
			t.Errorf("--%s shows in help", flag)
		}
	}
	for _, bad := range [][]string{{"--fault-crash", SubmitAfterCommit}, {"--fault-panic-tile", "8:1,2,3"}, {"--fault-fail-publish", "tile.completed"},
		{"--fault-slow-tile", "2:0,32,32,64"}, {"--fault-slow-tile", "2:0,32,32,64:soon"}} {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		f := AddFlags(fs, WorkerSeams)
		if err := fs.Parse(bad); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Plan(func(string) {}); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// A plan that breaks nothing makes no injector, and a nil injector breaks nothing.
func TestNothingPlannedBreaksNothing(t *testing.T) {
	i := New(Plan{Kill: func(string) { t.Fatal("killed") }}, quiet)
	if i != nil {
		t.Fatal("an injector for an empty plan")
	}
	i.At(quiet, BeforeAck)
	s := objstore.Store(nil)
	if i.Store(s) != s || i.Armed(BeforeAck) {
		t.Fatal("a nil injector wraps or arms")
	}
}

// The crash seam kills once, at the seam named and no other.
func TestAtKillsOnceAtItsSeam(t *testing.T) {
	var kills []string
	i := New(Plan{Crash: AfterEvent, Kill: func(seam string) { kills = append(kills, seam) }}, quiet)
	i.At(quiet, BeforeAck)
	i.At(quiet, AfterEvent)
	i.At(quiet, AfterEvent)
	if len(kills) != 1 || kills[0] != AfterEvent {
		t.Fatalf("kills %v, want one at %s", kills, AfterEvent)
	}
}

// Publishes of the planned event type fail as NATS timeouts, as many times as planned.
func TestPublisherFailsThePlannedEvents(t *testing.T) {
	i := New(Plan{FailPublish: "tile.completed", FailPublishN: 2}, quiet)
	var sent []string
	pub := i.Publisher(func(_ context.Context, subject string, _ []byte) error {
		sent = append(sent, subject)
		return nil
	})
	var failed int
	for _, subject := range []string{"events.tile.started", "events.tile.completed", "events.tile.completed", "events.tile.completed"} {
		if err := pub(context.Background(), subject, nil); err != nil {
			if !errors.Is(err, nats.ErrTimeout) {
				t.Fatalf("injected failure %v is no NATS timeout", err)
			}
			failed++
		}
	}
	if failed != 2 || strings.Join(sent, ",") != "events.tile.started,events.tile.completed" {
		t.Fatalf("%d failed, sent %v", failed, sent)
	}
}

// The store's seams strike at the tile's own writes: its manifest, and its checkpoint.
func TestStoreSeams(t *testing.T) {
	ctx := context.Background()
	const fk, tk = "ffff", "aaaa"
	for _, c := range []struct {
		seam  string
		write func(s objstore.Store) error
		want  int // kills after the write
	}{
		{AfterUpload, func(s objstore.Store) error {
			return s.PutIfAbsent(ctx, finalize.ManifestKey(layout.TileManifestKey(fk, tk)), []byte("{}"))
		}, 1},
		{AfterManifest, func(s objstore.Store) error {
			return s.PutIfAbsent(ctx, finalize.ManifestKey(layout.TileManifestKey(fk, tk)), []byte("{}"))
		}, 1},
		{AfterManifest, func(s objstore.Store) error {
			return s.PutIfAbsent(ctx, finalize.ManifestKey(layout.FrameManifestKey(fk, "png")), []byte("{}"))
		}, 0},
		{AfterCheckpoint, func(s objstore.Store) error { return s.Put(ctx, layout.CheckpointKey(tk), []byte("c")) }, 1},
		{AfterCheckpoint, func(s objstore.Store) error { return s.Put(ctx, "attempts/x/y/z", []byte("c")) }, 0},
	} {
		fs, err := objstore.NewFSStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		kills := 0
		i := New(Plan{Crash: c.seam, Kill: func(string) { kills++ }}, quiet)
		if err := c.write(i.Store(fs)); err != nil {
			t.Fatal(err)
		}
		if kills != c.want {
			t.Errorf("%s: %d kills, want %d", c.seam, kills, c.want)
		}
	}
}

// The mid-pass seam renders half a pass and strikes only once a checkpoint of the tile is in
// the store; a tile that panics panics in every attempt.
func TestTileFaults(t *testing.T) {
	ctx := context.Background()
	fs, err := objstore.NewFSStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	killed := make(chan int, 1)
	st := render.Settings{SPP: 8}
	r := render.Rect{X1: 1, Y1: 1}
	inner := &fakeTile{}
	i := New(Plan{Crash: MidPass, Kill: func(string) { killed <- inner.next }}, quiet)
	tile := i.Tile(inner, "tk", 1, r, st, quiet)
	if err := tile.Render(ctx, 0, 4); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tile.Render(ctx, 4, 8) }()
	select {
	case <-killed:
		t.Fatal("struck before any checkpoint was in the store")
	case <-time.After(50 * time.Millisecond):
	}
	if err := i.Store(fs).Put(ctx, layout.CheckpointKey("tk"), []byte("c")); err != nil {
		t.Fatal(err)
	}
	if at := <-killed; at != 6 {
		t.Fatalf("struck at sample %d, want half way through [4,8)", at)
	}
	if err := <-done; err != nil || inner.next != 8 {
		t.Fatalf("the pass ended at %d: %v", inner.next, err)
	}

	p := New(Plan{PanicTile: &TileAt{Frame: 1, Rect: r}}, quiet)
	defer func() {
		if recover() == nil {
			t.Fatal("the planned tile did not panic")
		}
	}()
	_ = p.Tile(&fakeTile{}, "tk", 1, r, st, quiet).Render(ctx, 0, 1)
}

type fakeTile struct {
	scene.Tile
	next int
}

func (f *fakeTile) Next() int { return f.next }
func (f *fakeTile) Render(_ context.Context, from, to int) error {
	f.next = to
	return nil
}

// The slow tile sleeps its delay after each of its passes; any other tile does not.
func TestSlowTileSleepsAfterEachPass(t *testing.T) {
	r := render.Rect{X1: 32, Y1: 32}
	i := New(Plan{SlowTile: &TileAt{Frame: 1, Rect: r}, SlowTileDelay: 60 * time.Millisecond}, quiet)
	timed := func(frame int, rect render.Rect) time.Duration {
		tl := i.Tile(&fakeTile{}, "tk", frame, rect, render.Settings{}, quiet)
		start := time.Now()
		for p := range 3 {
			if err := tl.Render(context.Background(), p, p+1); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	if d := timed(1, r); d < 180*time.Millisecond {
		t.Fatalf("three passes of the slow tile took %v, want at least 3 x 60ms", d)
	}
	if d := timed(2, r); d >= 180*time.Millisecond {
		t.Fatalf("three passes of the same rectangle in another frame took %v, want no delays", d)
	}
}
