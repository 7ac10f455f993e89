package blender

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// Tile renders one pixel rectangle of one frame of a Scene, pass by pass: each pass is one
// Cycles border render of the samples [a, b) (sample_offset a, samples b-a) of every view layer
// and pass, combined into float64 sums channel by channel by the channel's rule (channels.go:
// a mean times b-a, the first range's value, a weighted mean, a Cryptomatte merge), in pass
// order. For a fixed partition of the samples that is deterministic, so a tile resumed from its
// sums after any pass ends with the same bits as one rendered straight through. A Tile is not
// safe for concurrent use.
type Tile struct {
	pool  *Pool
	scene *Scene
	st    render.Settings
	frame int
	rect  render.Rect
	ends  []int
	next  int
	sum   []float64
	stats Stats
	// threads is how many threads the next pass renders with: the pool's, or more lent by idle
	// slots (SetThreads). A pass's bits do not depend on it.
	threads int
}

// Stats say where a tile's time went: the passes rendered, the time Blender's own render
// calls took (sync, BVH, samples, writing the pass), and the whole time of those passes, so
// the rest is the adapter's overhead (request, settings, reading and adding the pass).
type Stats struct {
	Passes  int
	Blender time.Duration
	Total   time.Duration
}

// NewTile prepares rendering rect r of frame. The settings must fix the pass partition and
// carry the pool's build fingerprint: a tile made for another Blender build is refused with
// ErrBuildMismatch, since its bits could differ.
func NewTile(ctx context.Context, pool *Pool, sc *Scene, st render.Settings, frame int, r render.Rect) (*Tile, error) {
	if st.Passes < 1 || st.Passes > st.SPP {
		return nil, sceneErr("settings.passes %d: a Blender tile needs between 1 and %d passes fixed at submit", st.Passes, st.SPP)
	}
	if err := render.ValidateSize(st); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrScene, err)
	}
	if r.X0 < 0 || r.Y0 < 0 || r.X1 > st.Width || r.Y1 > st.Height || r.X0 >= r.X1 || r.Y0 >= r.Y1 {
		return nil, sceneErr("rect [%d,%d)x[%d,%d) is empty or outside the %dx%d image", r.X0, r.X1, r.Y0, r.Y1, st.Width, st.Height)
	}
	build, err := pool.Build(ctx)
	if err != nil {
		return nil, err
	}
	if st.Build != build {
		return nil, fmt.Errorf("%w: the tile was made for %q, this worker runs %q (the farm routes a tile only to workers of its build: is this worker misconfigured?)", ErrBuildMismatch, st.Build, build)
	}
	if want := len(sc.Desc.TileChannels(st.Whole)); st.Values() != want {
		return nil, sceneErr("settings.channels %d: the scene's tiles have %d channels", st.Values(), want)
	}
	return &Tile{pool: pool, scene: sc, st: st, frame: frame, rect: r, ends: st.PassEnds(0),
		sum: make([]float64, st.Values()*r.Dx()*r.Dy()), threads: pool.o.Threads}, nil
}

// SetThreads makes the next passes render with n threads (n < 1: one), whatever the pool's
// processes were started with: Blender 3.4, 4.2, 4.5 and 5.0 write the same bits with any.
func (t *Tile) SetThreads(n int) { t.threads = max(n, 1) }

// Threads is how many threads the next pass renders with.
func (t *Tile) Threads() int { return t.threads }

// Render renders samples [from, to), which must start at Next and end at the end of a pass
// of the partition. A cancelled ctx kills the pass's Blender process; the tile stays at the
// last complete pass.
func (t *Tile) Render(ctx context.Context, from, to int) error {
	if from != t.next {
		return fmt.Errorf("blender: from = %d, but the tile's next sample is %d", from, t.next)
	}
	if to != from && !slices.Contains(t.ends, to) {
		return fmt.Errorf("blender: %d is not the end of a pass of %v", to, t.ends)
	}
	for _, end := range t.ends {
		if end <= t.next || end > to {
			continue
		}
		start := time.Now()
		pix, blenderTime, err := t.pass(ctx, t.next, end)
		if err != nil {
			return err
		}
		t.scene.plan(t.st.Whole).add(t.sum, pix, t.next, end-t.next)
		t.next = end
		t.stats.Passes++
		t.stats.Blender += blenderTime
		t.stats.Total += time.Since(start)
	}
	return nil
}

// Stats returns where the time of the passes rendered so far went.
func (t *Tile) Stats() Stats { return t.stats }

// pass renders samples [a, b) of the tile and returns every channel of it, interleaved in the
// description's order, row-major, and how long Blender's render call took.
func (t *Tile) pass(ctx context.Context, a, b int) ([]float32, time.Duration, error) {
	out, err := t.pool.scratch(".exr")
	if err != nil {
		return nil, 0, err
	}
	defer os.Remove(out)
	blend := t.scene.Blend()
	req := map[string]any{"op": "render", "file": blend, "frame": t.frame, "camera": t.st.Camera,
		"width": t.st.Width, "height": t.st.Height, "seed": t.st.Seed, "whole": t.st.Whole,
		"rect": []int{t.rect.X0, t.rect.Y0, t.rect.X1, t.rect.Y1}, "from": a, "to": b, "spp": t.st.SPP, "out": out,
		"threads": t.threads}
	line, err := t.pool.call(ctx, blend, req)
	if err != nil {
		return nil, 0, fmt.Errorf("rendering samples [%d,%d) of tile %v: %w", a, b, t.rect, err)
	}
	var reply struct {
		Seconds float64 `json:"render_seconds"`
	}
	if err := json.Unmarshal(line, &reply); err != nil {
		return nil, 0, fmt.Errorf("%w: unreadable render reply: %v", ErrProcess, err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: reading the rendered pass: %v", ErrProcess, err)
	}
	f, _, err := raster.DecodeEXRChannels(data)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: reading the rendered pass: %v", ErrProcess, err)
	}
	if want := t.scene.Desc.TileChannels(t.st.Whole); !slices.Equal(f.Names, want) {
		return nil, 0, fmt.Errorf("%w: Blender rendered the channels %q, the scene was inspected with %q", ErrBuildMismatch, f.Names, want)
	}
	if f.Width != t.rect.Dx() || f.Height != t.rect.Dy() {
		return nil, 0, fmt.Errorf("%w: Blender rendered %dx%d pixels for the %dx%d tile %v", ErrProcess, f.Width, f.Height, t.rect.Dx(), t.rect.Dy(), t.rect)
	}
	return f.Pix, time.Duration(reply.Seconds * float64(time.Second)), nil
}

// Next returns the next sample to render.
func (t *Tile) Next() int { return t.next }

// Export returns a deep copy of the tile's progress.
func (t *Tile) Export() render.State {
	return render.State{Next: t.next, Sum: slices.Clone(t.sum)}
}

// Import restores progress saved by Export, after checking that it fits this tile: the right
// number of finite sums, and a next sample at the end of a pass.
func (t *Tile) Import(st render.State) error {
	if err := st.Check(len(t.sum), t.st.SPP); err != nil {
		return fmt.Errorf("blender: %w", err)
	}
	if st.Next != 0 && !slices.Contains(t.ends, st.Next) {
		return fmt.Errorf("blender: state's next sample %d is not the end of a pass of %v", st.Next, t.ends)
	}
	copy(t.sum, st.Sum)
	t.next = st.Next
	return nil
}

// Pixels returns every channel of the samples so far, interleaved in the description's order,
// row-major over the rect: what one render of those samples gives, channel by channel.
func (t *Tile) Pixels() []float32 {
	out := make([]float32, len(t.sum))
	if t.next == 0 {
		return out
	}
	t.scene.plan(t.st.Whole).pixels(t.sum, t.next, out)
	return out
}
