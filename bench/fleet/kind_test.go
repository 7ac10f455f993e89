package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/render"
)

// A fleet tile's pixels are the same however its samples are split into passes and whether it
// resumed from a checkpoint, as the farm's promise needs of every kind; its render waits its
// share of the tile's time.
func TestTilePixelsAreDeterministic(t *testing.T) {
	ctx := t.Context()
	doc := Document{Width: 24, Height: 16, TileSize: 8, TileSeconds: 0.02, SPP: 4, First: 1, Last: 3}
	b := doc.Bundle()
	kinds := scene.Kinds{Kind{}}
	k, d, err := kinds.Check(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.(Kind); !ok {
		t.Fatalf("checked as a %s", k.Name())
	}
	st, err := d.Resolve(render.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	rd, _, err := kinds.Load(ctx, b, b.Version(), "")
	if err != nil {
		t.Fatal(err)
	}
	r := render.Rect{X0: 8, Y0: 8, X1: 16, Y1: 16}
	render := func(ends ...int) []float32 {
		tl, err := rd.NewTile(ctx, st, 2, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, to := range ends {
			if err := tl.Render(ctx, tl.Next(), to); err != nil {
				t.Fatal(err)
			}
		}
		return tl.Pixels()
	}
	start := time.Now()
	whole := render(4)
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Errorf("a tile of 0.02 s rendered in %v", took)
	}
	passes := render(1, 2, 3, 4)
	// Resumed: half rendered, exported, imported into a fresh tile.
	half, err := rd.NewTile(ctx, st, 2, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := half.Render(ctx, 0, 2); err != nil {
		t.Fatal(err)
	}
	resumed, err := rd.NewTile(ctx, st, 2, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := resumed.Import(half.Export()); err != nil {
		t.Fatal(err)
	}
	if err := resumed.Render(ctx, 2, 4); err != nil {
		t.Fatal(err)
	}
	for name, pix := range map[string][]float32{"passes": passes, "resumed": resumed.Pixels()} {
		for i := range whole {
			if pix[i] != whole[i] {
				t.Fatalf("%s: value %d is %v, in one pass %v", name, i, pix[i], whole[i])
			}
		}
	}
	for y := r.Y0; y < r.Y1; y++ {
		for x := r.X0; x < r.X1; x++ {
			i := 3 * ((y-r.Y0)*r.Dx() + x - r.X0)
			if want := Pixel(st, 2, x, y); whole[i] != want[0] || whole[i+1] != want[1] || whole[i+2] != want[2] {
				t.Fatalf("pixel (%d,%d) = %v, Pixel says %v", x, y, whole[i:i+3], want)
			}
		}
	}
}

// recording is an Observer that keeps what it was told.
type recording struct {
	leased   []string
	rendered int
}

func (r *recording) Leased(key string, _ time.Time) { r.leased = append(r.leased, key) }
func (r *recording) Rendered(time.Time)             { r.rendered++ }

// The renderer tells a worker's Observer the key of each tile it makes, the key the farm gave
// the tile (identity.TileKey of its frame key), and when a tile's last pass ended.
func TestObserverLearnsTileKeys(t *testing.T) {
	doc := Document{Width: 16, Height: 16, TileSize: 8, TileSeconds: 0, First: 1, Last: 1}
	b := doc.Bundle()
	rd, err := Kind{}.Load(t.Context(), b, b.Version(), "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := doc.Resolve(render.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	o := &recording{}
	ctx := WithObserver(context.Background(), o)
	r := render.Rect{X0: 0, Y0: 8, X1: 8, Y1: 16}
	tl, err := rd.NewTile(ctx, st, 1, r)
	if err != nil {
		t.Fatal(err)
	}
	want := identity.TileKey(identity.FrameKey(b.Version(), st.Camera, 1, identity.SettingsHash(st)), r)
	if len(o.leased) != 1 || o.leased[0] != want {
		t.Fatalf("leased %v, want [%s]", o.leased, want)
	}
	if err := tl.Render(ctx, 0, st.SPP-1); err != nil {
		t.Fatal(err)
	}
	if o.rendered != 0 {
		t.Fatal("told rendered before the last pass")
	}
	if err := tl.Render(ctx, st.SPP-1, st.SPP); err != nil {
		t.Fatal(err)
	}
	if o.rendered != 1 {
		t.Fatalf("told rendered %d times after the last pass, want 1", o.rendered)
	}
}

// A tile's dispatch is measured from when both it and its worker's slot were ready.
func TestProbeMeasuresFromTheLaterOfPublicationAndFreeSlot(t *testing.T) {
	rec := &Recorder{}
	t0 := time.Unix(1000, 0)
	p := newProbe(rec, t0)
	p.fetched("a", t0.Add(-time.Second)) // published before the slot was free: a backlog
	p.Leased("a", t0.Add(30*time.Millisecond))
	p.Rendered(t0.Add(2 * time.Second))
	p.fetched("b", t0.Add(3*time.Second)) // published after the slot was free: an idle worker
	p.Leased("b", t0.Add(3*time.Second+5*time.Millisecond))
	p.Leased("c", t0.Add(4*time.Second)) // never fetched through the tap: not measured
	got := rec.Samples()
	if len(got) != 2 || got[0].Dispatch != 30*time.Millisecond || got[0].Waited != 1030*time.Millisecond ||
		got[1].Dispatch != 5*time.Millisecond || got[1].Waited != 5*time.Millisecond {
		t.Fatalf("samples %+v", got)
	}
}

func TestWindowAndSaturation(t *testing.T) {
	t0 := time.Unix(0, 0)
	var pts []point
	for i := range 11 {
		pts = append(pts, point{at: t0.Add(time.Duration(i) * time.Second), completed: float64(10 * i)})
	}
	a, z, err := window(pts, 100)
	if err != nil || a.completed != 20 || z.completed != 80 {
		t.Fatalf("window %v-%v, %v; want 20-80", a.completed, z.completed, err)
	}
	// A job that stopped at half is measured from a fifth to its end.
	if a, z, err = window(pts[:6], 100); err != nil || a.completed != 20 || z.completed != 50 {
		t.Fatalf("window %v-%v, %v; want 20-50", a.completed, z.completed, err)
	}
	if _, _, err = window(pts[:2], 100); err == nil {
		t.Fatal("a window before a fifth of the tiles")
	}
	rows := []Row{{Workers: 10, TilesPerS: 9.5, IdealTilesPerS: 10}, {Workers: 100, TilesPerS: 70, IdealTilesPerS: 100}, {Workers: 1000, TilesPerS: 100, IdealTilesPerS: 1000}}
	if got := Saturation(rows, 0.8); got != 100 {
		t.Fatalf("saturation at %d, want 100", got)
	}
	if got := Saturation(rows[:1], 0.8); got != 0 {
		t.Fatalf("saturation at %d, want none", got)
	}
}
