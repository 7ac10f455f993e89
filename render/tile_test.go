package render

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRenderAllocs: after warm-up, a sample pass over a tile allocates
// nothing, on a scene with every primitive kind and material.
func TestRenderAllocs(t *testing.T) {
	for _, name := range []string{"cornell", "shot"} {
		s := loadExample(t, name)
		st := small(s, 64, 48, 1000)
		tl, err := NewTile(s, st, 3, Rect{8, 8, 40, 40})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := tl.Render(ctx, 0, 1); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(5, func() {
			n := tl.Next()
			if err := tl.Render(ctx, n, n+2); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per 2-sample pass, want 0", name, allocs)
		}
	}
}

func TestRenderCancelledContext(t *testing.T) {
	s := loadExample(t, "cornell")
	st := small(s, 32, 32, 4)
	tl, err := NewTile(s, st, 1, Rect{0, 0, 32, 32})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tl.Render(ctx, 0, 4); !errors.Is(err, context.Canceled) {
		t.Fatalf("Render with cancelled ctx = %v, want context.Canceled", err)
	}
	if tl.Next() != 0 {
		t.Fatalf("Next = %d after cancelled render, want 0", tl.Next())
	}
	for _, v := range tl.Export().Sum {
		if v != 0 {
			t.Fatal("cancelled render left partial sums")
		}
	}
	dctx, dcancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer dcancel()
	if err := tl.Render(dctx, 0, 4); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Render with expired ctx = %v, want context.DeadlineExceeded", err)
	}
}

// countdownCtx is cancelled after its Err method has been called n times:
// a deterministic way to cancel in the middle of a pass.
type countdownCtx struct {
	context.Context
	left atomic.Int64
}

func (c *countdownCtx) Err() error {
	if c.left.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// TestRenderCancelMidPass cancels partway through sample 2 and checks the
// tile stays at the last complete sample and resumes to the exact result of
// an uninterrupted render.
func TestRenderCancelMidPass(t *testing.T) {
	s := loadExample(t, "cornell")
	st := small(s, 24, 20, 4)
	r := Rect{0, 0, 24, 20}
	ref, err := NewTile(s, st, 1, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Render(context.Background(), 0, 4); err != nil {
		t.Fatal(err)
	}
	tl, err := NewTile(s, st, 1, r)
	if err != nil {
		t.Fatal(err)
	}
	ctx := &countdownCtx{Context: context.Background()}
	ctx.left.Store(int64(2*r.Dy() + 7)) // two full passes, then 7 rows of the third
	if err := tl.Render(ctx, 0, 4); !errors.Is(err, context.Canceled) {
		t.Fatalf("Render = %v, want context.Canceled", err)
	}
	if tl.Next() != 2 {
		t.Fatalf("Next = %d after cancel in pass 2, want 2", tl.Next())
	}
	if err := tl.Render(context.Background(), 2, 4); err != nil {
		t.Fatal(err)
	}
	a, b := tl.Export(), ref.Export()
	for i := range a.Sum {
		if math.Float64bits(a.Sum[i]) != math.Float64bits(b.Sum[i]) {
			t.Fatalf("resumed sum %d differs", i)
		}
	}
}

func TestRenderRangeErrors(t *testing.T) {
	s := loadExample(t, "cornell")
	st := small(s, 8, 8, 4)
	tl, err := NewTile(s, st, 1, Rect{0, 0, 8, 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := tl.Render(ctx, 1, 2); err == nil || !strings.Contains(err.Error(), "next sample is 0") {
		t.Errorf("Render(1,2) on a fresh tile = %v", err)
	}
	if err := tl.Render(ctx, 0, 5); err == nil {
		t.Error("Render beyond SPP accepted")
	}
	if err := tl.Render(ctx, 0, 0); err != nil || tl.Next() != 0 {
		t.Errorf("empty Render = %v, Next %d", err, tl.Next())
	}
	for _, v := range tl.Pixels() {
		if v != 0 {
			t.Fatal("Pixels before any sample are not zero")
		}
	}
}

func TestImportValidation(t *testing.T) {
	s := loadExample(t, "cornell")
	st := small(s, 8, 8, 4)
	tl, err := NewTile(s, st, 1, Rect{0, 0, 4, 2})
	if err != nil {
		t.Fatal(err)
	}
	ok := make([]float64, 3*4*2)
	ok[5] = 1.5
	bad := []State{
		{Next: 1, Sum: make([]float64, 3*4*2-1)},
		{Next: 1, Sum: nil},
		{Next: -1, Sum: ok},
		{Next: 5, Sum: ok},
		{Next: 0, Sum: ok},
		{Next: 1, Sum: append(append([]float64(nil), ok[:23]...), math.NaN())},
		{Next: 1, Sum: append(append([]float64(nil), ok[:23]...), math.Inf(1))},
	}
	for _, b := range bad {
		if err := tl.Import(b); err == nil {
			t.Errorf("Import(Next=%d, len %d) accepted", b.Next, len(b.Sum))
		}
	}
	if tl.Next() != 0 {
		t.Fatal("failed Import changed the tile")
	}
	if err := tl.Import(State{Next: 2, Sum: ok}); err != nil {
		t.Fatal(err)
	}
	ok[5] = 99 // Import must copy
	if px := tl.Pixels(); px[5] != 0.75 {
		t.Fatalf("pixel 5 = %v, want 1.5/2", px[5])
	}
}

// TestNonFiniteSamplesDiscarded: samples that reach an infinite emitter are
// Inf (or NaN where Inf meets 0); they must be dropped whole, leaving finite
// pixels, and not poison the accumulators.
func TestNonFiniteSamplesDiscarded(t *testing.T) {
	js := `{"settings": {"width": 8, "height": 8, "spp": 4, "max_depth": 4},
		"background": [0.5, 0.5, 0.5],
		"cameras": [{"name": "c", "position": [0, 0.5, 4], "look_at": [0, 0.5, 0], "fov": 30}],
		"materials": [{"name": "m", "type": "diffuse"}, {"name": "hot", "type": "emissive"}],
		"objects": [{"type": "plane", "normal": [0, 1, 0], "material": "m"},
			{"type": "sphere", "center": [0, 0.5, 0], "radius": 0.5, "material": "hot"}]}`
	s, err := ParseScene([]byte(js), nil)
	if err != nil {
		t.Fatal(err)
	}
	// JSON cannot carry Inf, so poke it in behind the parser's back.
	s.materials[1].emission = Vec{math.Inf(1), 0, 1}
	st := s.Defaults()
	px := renderTiled(t, s, st, 1, 0)
	nonZero := 0
	for i, v := range px {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("value %d is %v", i, v)
		}
		if v != 0 {
			nonZero++
		}
	}
	if nonZero == 0 {
		t.Fatal("everything is zero: the test scene is broken")
	}
	// The centre pixels see the infinite light directly: every sample is
	// dropped, so they are exactly zero.
	for _, c := range []int{0, 1, 2} {
		if v := meanRegion(px, st.Width, Rect{3, 3, 5, 5}, c); v != 0 {
			t.Errorf("centre channel %d = %v, want 0", c, v)
		}
	}
}

func TestTrackEval(t *testing.T) {
	tr := track{{frame: 10, v: Vec{10, 0, 0}}, {frame: 1, v: Vec{0, 0, 0}}, {frame: 20, v: Vec{10, 10, 0}}}
	if _, ok := sortTrack(tr); !ok {
		t.Fatal("unexpected duplicate")
	}
	cases := []struct {
		f    int
		e    easing
		want Vec
	}{
		{-5, easeLinear, Vec{0, 0, 0}},
		{1, easeLinear, Vec{0, 0, 0}},
		{4, easeLinear, Vec{10 * 3.0 / 9, 0, 0}},
		{10, easeLinear, Vec{10, 0, 0}},
		{15, easeLinear, Vec{10, 5, 0}},
		{15, easeSmooth, Vec{10, 5, 0}},
		{12, easeSmooth, Vec{10, 10 * (0.04 * (3 - 0.4)), 0}},
		{99, easeSmooth, Vec{10, 10, 0}},
	}
	for _, c := range cases {
		if got := tr.eval(c.f, c.e, Vec{-1, -1, -1}); got.Sub(c.want).Length() > 1e-12 {
			t.Errorf("eval(%d, %d) = %v, want %v", c.f, c.e, got, c.want)
		}
	}
	if got := (track{}).eval(5, easeLinear, Vec{1, 2, 3}); got != (Vec{1, 2, 3}) {
		t.Errorf("empty track = %v, want base", got)
	}
	if _, ok := sortTrack(track{{frame: 2}, {frame: 2}}); ok {
		t.Error("duplicate frame not reported")
	}
}

func TestTransform(t *testing.T) {
	xf := newTransform(Vec{1, 2, 3}, Vec{0, 90, 0}, Vec{2, 2, 2})
	if got := xf.point(Vec{1, 0, 0}); got.Sub(Vec{1, 2, 1}).Length() > 1e-12 {
		t.Errorf("point = %v, want (1,2,1)", got) // (2,0,0) rotated 90° about Y is (0,0,-2)
	}
	ns := newTransform(Vec{}, Vec{}, Vec{1, 4, 1})
	// A 45° surface normal stretched in y tilts toward x: n' ∝ (1, 1/4, 0).
	if got := ns.normal(Vec{1, 1, 0}.Normalize()); got.Sub(Vec{1, 0.25, 0}.Normalize()).Length() > 1e-12 {
		t.Errorf("normal = %v", got)
	}
	rx := newTransform(Vec{}, Vec{90, 0, 0}, Vec{1, 1, 1})
	if got := rx.vector(Vec{0, 1, 0}); got.Sub(Vec{0, 0, 1}).Length() > 1e-12 {
		t.Errorf("rotate X 90 of +y = %v, want +z", got)
	}
	rz := newTransform(Vec{}, Vec{0, 0, 90}, Vec{1, 1, 1})
	if got := rz.vector(Vec{1, 0, 0}); got.Sub(Vec{0, 1, 0}).Length() > 1e-12 {
		t.Errorf("rotate Z 90 of +x = %v, want +y", got)
	}
}

// TestSamplerIndependence: the stream depends on every input.
func TestSamplerIndependence(t *testing.T) {
	base := newSampler(frameKey(1, 1), 3, 4, 5)
	v := base.at(0)
	others := []sampler{
		newSampler(frameKey(2, 1), 3, 4, 5),
		newSampler(frameKey(1, 2), 3, 4, 5),
		newSampler(frameKey(1, 1), 4, 4, 5),
		newSampler(frameKey(1, 1), 3, 5, 5),
		newSampler(frameKey(1, 1), 3, 4, 6),
		newSampler(frameKey(1, 1), 4, 3, 5),
	}
	for i, o := range others {
		if o.at(0) == v {
			t.Errorf("sampler %d repeats the base stream", i)
		}
	}
	if base.at(1) == v {
		t.Error("dimensions 0 and 1 equal")
	}
	// Crude uniformity check over many pixels.
	sum, n := 0.0, 20000
	for i := range n {
		s := newSampler(frameKey(9, 1), i%200, i/200, 0)
		x := s.at(7)
		if x < 0 || x >= 1 {
			t.Fatalf("sample %v outside [0,1)", x)
		}
		sum += x
	}
	if m := sum / float64(n); math.Abs(m-0.5) > 0.01 {
		t.Errorf("mean %v, want ≈ 0.5", m)
	}
}
