package render

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
)

// Rect is a half-open pixel rectangle [X0, X1) × [Y0, Y1); y=0 is the top row.
type Rect struct{ X0, Y0, X1, Y1 int }

// Dx returns the width of r.
func (r Rect) Dx() int { return r.X1 - r.X0 }

// Dy returns the height of r.
func (r Rect) Dy() int { return r.Y1 - r.Y0 }

// State is a tile's progress: the float64 per-pixel RGB sums of samples
// [0, Next), row-major over the rect. Restoring it with Import resumes the
// tile bit for bit.
type State struct {
	Next int
	Sum  []float64
}

// Check reports whether st can be the progress of a tile of sums values and spp samples: the
// right number of finite sums, a next sample in [0, spp], and no sums before the first sample.
// Every renderer's Import checks a checkpoint with it before trusting it.
func (st State) Check(sums, spp int) error {
	if len(st.Sum) != sums {
		return fmt.Errorf("state has %d sums, tile needs %d", len(st.Sum), sums)
	}
	if st.Next < 0 || st.Next > spp {
		return fmt.Errorf("state next sample %d outside [0,%d]", st.Next, spp)
	}
	for _, v := range st.Sum {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return errors.New("state holds a non-finite sum")
		}
		if st.Next == 0 && v != 0 {
			return errors.New("state has sums but no samples")
		}
	}
	return nil
}

// Tile renders one pixel rectangle of one frame progressively. A Tile is not
// safe for concurrent use; callers parallelise over tiles.
type Tile struct {
	w    *world
	cam  camFrame
	st   Settings
	rect Rect
	fk   uint64
	next int
	sum  []float64
	pass []float64 // radiance of the pass in progress, committed to sum when complete
	rays uint64    // rays cast, for benchmarks
	// threads is how many goroutines render a sample index (SetThreads); 0 is one.
	threads int

	// legacy replaces the sampler's numbers when set (see sampler.legacy):
	// only tests and benchmarks set it. Production tiles leave it nil.
	legacy func(key uint64, idx uint32, d uint64) float64
}

// NewTile prepares rendering rect r of frame with settings st, which are
// validated against s. Bad settings or a rect outside the image are
// *SceneError (field "settings.*" or "rect").
func NewTile(s *Scene, st Settings, frame int, r Rect) (*Tile, error) {
	if err := s.Validate(st); err != nil {
		return nil, err
	}
	if r.X0 < 0 || r.Y0 < 0 || r.X1 > st.Width || r.Y1 > st.Height || r.X0 >= r.X1 || r.Y0 >= r.Y1 {
		return nil, sceneErr("rect", "rect [%d,%d)x[%d,%d) is empty or outside the %dx%d image", r.X0, r.X1, r.Y0, r.Y1, st.Width, st.Height)
	}
	if frame < -MaxFrame || frame > MaxFrame {
		return nil, sceneErr("frame", "frame %d out of range", frame)
	}
	ci := s.cameraIndex(st.Camera)
	cam, err := s.cameras[ci].at(frame)
	if err != nil {
		return nil, sceneErr(fmt.Sprintf("cameras[%d]", ci), "%v", err)
	}
	w, err := s.world(frame)
	if err != nil {
		return nil, err
	}
	n := 3 * r.Dx() * r.Dy()
	return &Tile{
		w:    w,
		cam:  cam,
		st:   st,
		rect: r,
		fk:   frameKey(st.Seed, frame),
		sum:  make([]float64, n),
		pass: make([]float64, n),
	}, nil
}

// SetThreads makes Render render each sample index on n goroutines (n < 1: one), rows
// dealt round-robin. Every pixel's samples depend on the pixel and the sample index alone and
// each pixel is summed by one goroutine, so the bits do not depend on n (TestTileThreadsAreBitIdentical).
func (t *Tile) SetThreads(n int) {
	if n < 1 {
		n = 1
	}
	t.threads = n
}

// Threads is how many goroutines Render renders each sample index on.
func (t *Tile) Threads() int { return max(t.threads, 1) }

// Render renders sample indices [from, to) of every pixel. from must equal
// Next() and to must not exceed the settings' SPP. Samples are rendered one
// index at a time over the whole tile and committed only when the index is
// complete, so a cancellation (checked after every row) leaves the tile at
// the last complete sample index and returns ctx.Err().
func (t *Tile) Render(ctx context.Context, from, to int) error {
	if from != t.next {
		return fmt.Errorf("render: from = %d, but the tile's next sample is %d", from, t.next)
	}
	if to < from || to > t.st.SPP {
		return fmt.Errorf("render: sample range [%d,%d) is outside [%d,%d]", from, to, t.next, t.st.SPP)
	}
	n := min(max(t.threads, 1), t.rect.Dy())
	var errs []error
	var rays []uint64
	if n > 1 {
		errs, rays = make([]error, n), make([]uint64, n)
	}
	for si := from; si < to; si++ {
		if n == 1 {
			if err := t.renderRows(ctx, si, 0, 1, &t.rays); err != nil {
				return err
			}
		} else if err := t.renderParallel(ctx, si, errs, rays); err != nil {
			return err
		}
		for k, v := range t.pass {
			t.sum[k] += v
		}
		t.next = si + 1
	}
	return nil
}

// renderParallel renders sample index si on len(errs) goroutines, each its share of the rows.
func (t *Tile) renderParallel(ctx context.Context, si int, errs []error, rays []uint64) error {
	var wg sync.WaitGroup
	for g := range errs {
		rays[g] = 0
		wg.Go(func() { errs[g] = t.renderRows(ctx, si, g, len(errs), &rays[g]) })
	}
	wg.Wait()
	for _, r := range rays {
		t.rays += r
	}
	return errors.Join(errs...)
}

// renderRows renders sample index si of every stride-th row of the tile from its first+first,
// into t.pass. It returns ctx.Err() when cancelled between rows.
func (t *Tile) renderRows(ctx context.Context, si, first, stride int, rays *uint64) error {
	fw, fh := float64(t.st.Width), float64(t.st.Height)
	w := t.rect.Dx()
	for y := t.rect.Y0 + first; y < t.rect.Y1; y += stride {
		if err := ctx.Err(); err != nil {
			return err
		}
		i := 3 * (y - t.rect.Y0) * w
		for x := t.rect.X0; x < t.rect.X1; x++ {
			s := newSampler(t.fk, x, y, si)
			s.legacy = t.legacy
			jx, jy := s.pair(dimPixel)
			l1, l2 := s.pair(dimLens)
			r := t.cam.generate(float64(x)+jx, float64(y)+jy, fw, fh, l1, l2)
			c := t.w.radiance(r, &s, t.st.MaxDepth, rays)
			if !c.Finite() {
				c = Vec{} // a NaN/Inf sample is discarded, never poisons the pixel
			}
			t.pass[i], t.pass[i+1], t.pass[i+2] = c.X, c.Y, c.Z
			i += 3
		}
	}
	return nil
}

// Next returns the next sample index to render.
func (t *Tile) Next() int { return t.next }

// Rect returns the tile's pixel rectangle.
func (t *Tile) Rect() Rect { return t.rect }

// Export returns a deep copy of the tile's progress.
func (t *Tile) Export() State {
	return State{Next: t.next, Sum: append([]float64(nil), t.sum...)}
}

// Import restores progress saved by Export, after checking that it fits
// this tile and holds only finite sums.
func (t *Tile) Import(st State) error {
	if err := st.Check(len(t.sum), t.st.SPP); err != nil {
		return fmt.Errorf("render: %w", err)
	}
	copy(t.sum, st.Sum)
	t.next = st.Next
	return nil
}

// Pixels returns the mean radiance of the samples so far, RGB interleaved,
// row-major over the rect (len 3·w·h); all zero before the first sample.
func (t *Tile) Pixels() []float32 {
	out := make([]float32, len(t.sum))
	if t.next == 0 {
		return out
	}
	inv := 1 / float64(t.next)
	for i, v := range t.sum {
		out[i] = float32(v * inv)
	}
	return out
}
