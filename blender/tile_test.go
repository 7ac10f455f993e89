package blender_test

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/internal/logtest"
	"github.com/tilefarm/tilefarm/render"
)

// Property: a tile rendered as a Cycles border region is exactly the same pixels of a
// full-frame render, in every channel, for rectangle edges where the naive border p/N is a
// pixel off.
func TestBorderTileEqualsFullFrameRegion(t *testing.T) {
	pool := blendertest.Pool(t, 1)
	sc := loadExample(t, pool)
	st := settings(t, sc, 150, 97, 2, 1)
	full := renderTile(t, pool, sc, st, 1, render.Rect{X1: 150, Y1: 97})
	for _, r := range []render.Rect{{X0: 49, Y0: 0, X1: 101, Y1: 33}, {X0: 0, Y0: 33, X1: 49, Y1: 97}, {X0: 137, Y0: 61, X1: 150, Y1: 97}, {X0: 1, Y0: 1, X1: 2, Y1: 2}} {
		got := renderTile(t, pool, sc, st, 1, r)
		k := st.Values()
		i := 0
		for y := r.Y0; y < r.Y1; y++ {
			for x := r.X0; x < r.X1; x++ {
				for c := 0; c < k; c++ {
					if want := full[(y*150+x)*k+c]; got[i] != want {
						t.Fatalf("rect %v pixel (%d,%d)[%d] = %v, full frame has %v", r, x, y, c, got[i], want)
					}
					i++
				}
			}
		}
	}
}

// Property: a tile resumed from its exported sums after any pass ends with the same bits as
// one rendered straight through, and a partition of the samples differs from one pass only by
// float rounding.
func TestPassesResumeBitForBit(t *testing.T) {
	pool := blendertest.Pool(t, 1)
	sc := loadExample(t, pool)
	r := render.Rect{X0: 40, Y0: 30, X1: 90, Y1: 70}
	st := settings(t, sc, 160, 120, 12, 3)
	straight := renderTile(t, pool, sc, st, 2, r)

	ctx := context.Background()
	a := newTile(t, pool, sc, st, 2, r)
	if err := a.Render(ctx, 0, 4); err != nil {
		t.Fatal(err)
	}
	saved := a.Export()
	b := newTile(t, pool, sc, st, 2, r)
	if err := b.Import(saved); err != nil {
		t.Fatal(err)
	}
	if err := b.Render(ctx, b.Next(), 12); err != nil {
		t.Fatal(err)
	}
	if got := b.Pixels(); !equal(got, straight) {
		t.Fatal("a tile resumed after its first pass differs from one rendered straight through")
	}
	one := renderTile(t, pool, sc, settings(t, sc, 160, 120, 12, 1), 2, r)
	worst := 0.0
	for i := range one {
		d := math.Abs(float64(one[i]-straight[i])) / math.Max(math.Abs(float64(one[i])), 1e-3)
		worst = math.Max(worst, d)
	}
	if worst > 1e-5 {
		t.Fatalf("3 passes differ from 1 pass by %g relative; only rounding (< 1e-5) is expected", worst)
	}
	if equal(one, straight) {
		t.Log("3 passes happen to equal 1 pass bit for bit")
	}
	if err := b.Render(ctx, 12, 13); err == nil {
		t.Fatal("rendering past the last pass succeeded")
	}
	c := newTile(t, pool, sc, st, 2, r)
	if err := c.Render(ctx, 0, 6); err == nil {
		t.Fatal("rendering to the middle of a pass succeeded")
	}
}

func newTile(t *testing.T, pool *blender.Pool, sc *blender.Scene, st render.Settings, frame int, r render.Rect) *blender.Tile {
	t.Helper()
	tile, err := blender.NewTile(context.Background(), pool, sc, st, frame, r)
	if err != nil {
		t.Fatal(err)
	}
	return tile
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// Property: a pass's bits do not depend on what its Blender process rendered before (other
// frames, other rectangles, other sample counts), so any process of any worker may render it.
func TestPassIgnoresProcessHistory(t *testing.T) {
	fresh := blendertest.Pool(t, 1)
	sc := loadExample(t, fresh)
	st := settings(t, sc, 120, 90, 6, 2)
	r := render.Rect{X0: 30, Y0: 20, X1: 70, Y1: 60}
	want := renderTile(t, fresh, sc, st, 2, r)

	used := blendertest.Pool(t, 1)
	renderTile(t, used, sc, settings(t, sc, 160, 120, 3, 1), 7, render.Rect{X1: 160, Y1: 120})
	renderTile(t, used, sc, st, 1, render.Rect{X0: 5, Y0: 5, X1: 110, Y1: 80})
	if got := renderTile(t, used, sc, st, 2, r); !equal(got, want) {
		t.Fatal("the same tile differs on a process that rendered other work first")
	}
}

// Property: a tile's pass renders with the threads the worker gives it (Tile.SetThreads: its
// slot's, or more that idle slots lend), whatever its process was started with, and writes the
// same bits with any, on every line: a split tile, and a frame that renders whole with Cycles'
// adaptive sampling and, where the line has one, the denoiser (the frames lending is for). The
// driver reports the threads Blender renders with (RenderSettings.threads, which Blender's own
// -t would override: with it, every pass would report the same count).
func TestTileRendersWithTheThreadsItIsGiven(t *testing.T) {
	for _, line := range blendertest.Lines(t) {
		for _, tc := range []struct {
			name, expr string
			whole      bool
		}{
			{"split", "", false},
			{"whole", "; cy = bpy.context.scene.cycles; cy.use_adaptive_sampling = True; cy.adaptive_threshold = 0.05; cy.adaptive_min_samples = 0; cy.use_denoising = True", true},
		} {
			t.Run(line.Name+"/"+tc.name, func(t *testing.T) {
				var logs logtest.Buffer
				pool := blender.NewPool(blender.Options{Binary: line.Binary, Dir: t.TempDir(), Threads: 1,
					Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
				defer pool.Close()
				sc := load(t, pool, line.SavedWith(t, blendertest.Example(t), "bpy.ops.file.pack_all()"+tc.expr))
				st := settings(t, sc, 64, 48, 16, 1)
				if st.Whole != tc.whole {
					t.Fatalf("the scene renders whole: %v, want %v", st.Whole, tc.whole)
				}
				r := render.Rect{X0: 8, Y0: 4, X1: 56, Y1: 40}
				if tc.whole {
					r = render.Rect{X1: st.Width, Y1: st.Height}
				}
				own := renderTile(t, pool, sc, st, 1, r)
				lent := newTile(t, pool, sc, st, 1, r)
				if lent.Threads() != 1 {
					t.Fatalf("a tile of a one-thread pool renders with %d threads", lent.Threads())
				}
				lent.SetThreads(2)
				if err := lent.Render(t.Context(), 0, st.SPP); err != nil {
					t.Fatal(err)
				}
				// Blender's output is read beside its replies: its lines may come a moment later.
				both := func() bool {
					return strings.Contains(logs.String(), "with 2 threads") && strings.Contains(logs.String(), "with 1 threads")
				}
				for deadline := time.Now().Add(10 * time.Second); !both() && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
				if !both() {
					t.Fatalf("the driver did not render one pass with 1 thread and one with 2:\n%s", logs.String())
				}
				got := lent.Pixels()
				for i := range own {
					if math.Float32bits(got[i]) != math.Float32bits(own[i]) {
						t.Fatalf("value %d: %v with 2 threads, %v with 1", i, got[i], own[i])
					}
				}
			})
		}
	}
}
