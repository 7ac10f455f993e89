// Package fleet simulates a large farm on one machine, to measure what a fleet costs the
// coordinator and JetStream: N workers of the real worker code (worker.New with a real
// JetStream queue, object store and checkpoint database), hosted many to a process, whose
// renderer is a scene kind of this package that sleeps a set time per tile and yields
// deterministic pixels, against one coordinator (the real coordinator code, accepting the kind)
// and one external JetStream (a nats-server process or a cluster of three), each a process of
// its own so that the CPU of each can be read. bench/cmd/fleetnode runs the coordinator and the
// worker hosts; Measure starts them, submits enough tiles to keep every worker busy, and reports
// throughput, event rate, dispatch latency and the CPU of each side (docs/benchmarks.md, "Fleet").
package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// Format tags a fleet scene's document.
const Format = "tilefarm-fleet/1"

// Ext is the file extension of a fleet scene.
const Ext = ".fleet"

// defaultSPP is the samples a tile's time is spread over when the document names none: as
// many as the worker's default passes, so a tile renders in the passes a JSON scene's would.
const defaultSPP = 32

// maxTileSeconds bounds a tile's sleep: a fleet measures dispatch, not patience.
const maxTileSeconds = 3600

// Document is a fleet scene: the frame's size and tile size, how long a tile takes whatever
// its size, and its samples, over which that time is spread (the worker renders them in
// passes). TileSize is what Measure submits with: a kind's default tile size is not the
// document's to choose.
type Document struct {
	Format      string  `json:"format"`
	Width       int     `json:"width"`
	Height      int     `json:"height"`
	TileSize    int     `json:"tile_size"`
	TileSeconds float64 `json:"tile_seconds"`
	SPP         int     `json:"spp,omitempty"`
	First       int     `json:"first"`
	Last        int     `json:"last"`
}

// Encode is the document as a scene file.
func (d Document) Encode() []byte {
	d.Format = Format
	b, _ := json.Marshal(d) // plain data: cannot fail
	return b
}

// Bundle is the document as the scene bundle a client uploads.
func (d Document) Bundle() *bundle.Bundle {
	return bundle.FromMemory("fleet"+Ext, d.Encode(), nil)
}

// TilesPerFrame is how many tiles a frame of the document splits into at its tile size.
func (d Document) TilesPerFrame() int {
	if d.TileSize <= 0 {
		return 0
	}
	return ((d.Width + d.TileSize - 1) / d.TileSize) * ((d.Height + d.TileSize - 1) / d.TileSize)
}

// Kind is the kind of the fleet scenes: a renderer that only waits, so that thousands of
// workers fit on one machine and what is measured is the farm around them.
type Kind struct{}

var _ scene.Kind = Kind{}

// Name names the kind.
func (Kind) Name() string { return "fleet scene" }

// ClaimsFile claims the files ending in Ext.
func (Kind) ClaimsFile(path string) bool { return strings.HasSuffix(path, Ext) }

// ClaimsDocument claims a JSON document tagged Format.
func (Kind) ClaimsDocument(doc []byte) bool {
	var head struct {
		Format string `json:"format"`
	}
	return bytes.HasPrefix(bytes.TrimSpace(doc), []byte("{")) && json.Unmarshal(doc, &head) == nil && head.Format == Format
}

// Read reads a fleet scene file: a document and no assets.
func (Kind) Read(_ context.Context, path string) (*bundle.Bundle, error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return nil, failure.Terminalf("reading %s: %w", path, err)
	}
	if _, err := parse(doc); err != nil {
		return nil, failure.Terminal(err)
	}
	return bundle.FromMemory(filepath.Base(path), doc, nil), nil
}

// Describe parses the document.
func (Kind) Describe(doc []byte) (scene.Description, error) { return parse(doc) }

// Validate parses the document; a fleet scene has no assets.
func (Kind) Validate(_ context.Context, b *bundle.Bundle) error {
	_, err := parse(b.Scene)
	return err
}

// Load parses the document; version names the scene in the tile keys the renderer reports.
func (Kind) Load(_ context.Context, b *bundle.Bundle, version, _ string) (scene.Renderer, error) {
	d, err := parse(b.Scene)
	if err != nil {
		return nil, failure.Terminal(err)
	}
	return &renderer{doc: d, version: version}, nil
}

// TileSize is the default of a submission naming none; Measure submits the document's.
func (Kind) TileSize() int { return 64 }

// Formats are the RGB renderers' formats.
func (Kind) Formats() []string { return scene.RGBFormats }

// TilePreviews is true: a tile encodes on its own.
func (Kind) TilePreviews() bool { return true }

// EncodeTilePreview encodes the tile as the frame's 8-bit PNG holds it.
func (Kind) EncodeTilePreview(r render.Rect, pix []float32, _ render.Settings) ([]byte, error) {
	return raster.EncodePNG8(&raster.Frame{Width: r.Dx(), Height: r.Dy(), Pix: pix}, 0)
}

func parse(doc []byte) (Document, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	var d Document
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("fleet scene: %w", err)
	}
	switch {
	case d.Format != Format:
		return d, fmt.Errorf("fleet scene: format %q, want %q", d.Format, Format)
	case d.Last < d.First:
		return d, fmt.Errorf("fleet scene: frames %d-%d are reversed", d.First, d.Last)
	case d.TileSize <= 0:
		return d, fmt.Errorf("fleet scene: tile size %d, want a positive number of pixels", d.TileSize)
	case !(d.TileSeconds >= 0 && d.TileSeconds <= maxTileSeconds):
		return d, fmt.Errorf("fleet scene: tile_seconds %v, want 0-%d", d.TileSeconds, maxTileSeconds)
	}
	_, err := d.Resolve(render.Overrides{})
	return d, err
}

// Resolve is the document's settings with the overrides applied.
func (d Document) Resolve(o render.Overrides) (render.Settings, error) {
	st := render.Settings{Camera: "fleet", Width: d.Width, Height: d.Height, SPP: cmp.Or(d.SPP, defaultSPP), MaxDepth: 1}
	if o.Camera != "" && o.Camera != st.Camera {
		return render.Settings{}, fmt.Errorf("settings.camera: a fleet scene has only the camera %q", st.Camera)
	}
	if o.Passes != 0 {
		return render.Settings{}, errors.New("settings.passes: a fleet scene's pixels do not depend on its passes")
	}
	if o.Width != 0 {
		st.Width = o.Width
	}
	if o.Height != 0 {
		st.Height = o.Height
	}
	if o.SPP != 0 {
		st.SPP = o.SPP
	}
	if err := render.ValidateSize(st); err != nil {
		return render.Settings{}, err
	}
	return st, nil
}

// Frames is the document's frame range.
func (d Document) Frames() (first, last int) { return d.First, d.Last }

// FrameStep is 1: every frame.
func (d Document) FrameStep() int { return 1 }

// Assets are none.
func (d Document) Assets() []string { return nil }

// Notes say what the scene is.
func (d Document) Notes(render.Overrides) []string {
	return []string{fmt.Sprintf("a simulated load: every tile waits %gs, its pixels a pure function of position and frame", d.TileSeconds)}
}

// Pixel is pixel (x, y) of frame as the farm must deliver it.
func Pixel(st render.Settings, frame, x, y int) [3]float32 {
	v := value(st, frame, x, y)
	var out [3]float32
	for i := range out {
		out[i] = float32(v[i] * float64(st.SPP) / float64(st.SPP))
	}
	return out
}

// value is what every sample of pixel (x, y) of frame adds.
func value(st render.Settings, frame, x, y int) [3]float64 {
	return [3]float64{(float64(x) + 0.5) / float64(st.Width), (float64(y) + 0.5) / float64(st.Height), float64(frame%5) / 4}
}

// renderer is a loaded fleet scene.
type renderer struct {
	doc     Document
	version string
}

// NewTile tells the worker's Observer, if its context carries one, that the tile was leased:
// the Render flow makes a tile right after it took the tile's lease (docs/design.md, "Flows":
// Render), and only the scene cache's lookup lies between.
func (rd *renderer) NewTile(ctx context.Context, st render.Settings, frame int, r render.Rect) (scene.Tile, error) {
	now := time.Now()
	if r.X0 < 0 || r.Y0 < 0 || r.X1 > st.Width || r.Y1 > st.Height || r.X0 >= r.X1 || r.Y0 >= r.Y1 {
		return nil, failure.Terminalf("fleet: rect %v outside the %dx%d image", r, st.Width, st.Height)
	}
	o := observerFrom(ctx)
	if o != nil {
		fk := identity.FrameKey(rd.version, st.Camera, frame, identity.SettingsHash(st))
		o.Leased(identity.TileKey(fk, r), now)
	}
	perSample := time.Duration(rd.doc.TileSeconds * float64(time.Second) / float64(st.SPP))
	return &tile{st: st, frame: frame, r: r, perSample: perSample, o: o}, nil
}

// Channels is nil: the fleet's frames are linear RGB.
func (*renderer) Channels(render.Settings) []string { return nil }

// Encode encodes as every RGB renderer does, at exposure 0.
func (*renderer) Encode(_ context.Context, f *raster.Frame, _ int, _ render.Settings, formats []string) ([]scene.Output, error) {
	return scene.EncodeRGB(f, 0, formats)
}

// tile waits perSample for each sample it renders. Every sample of a pixel adds the same
// value, so its sums after n samples are n times that value, however the samples were split
// into passes or resumed.
type tile struct {
	st        render.Settings
	frame     int
	r         render.Rect
	perSample time.Duration
	next      int
	o         Observer // nil: nobody watches
}

func (t *tile) Next() int { return t.next }

func (t *tile) Render(ctx context.Context, from, to int) error {
	if from != t.next || to < from || to > t.st.SPP {
		return fmt.Errorf("fleet: render [%d,%d) of a tile at sample %d of %d", from, to, t.next, t.st.SPP)
	}
	if d := time.Duration(to-from) * t.perSample; d > 0 {
		timer := time.NewTimer(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			t.stopped()
			return ctx.Err()
		case <-timer.C:
		}
	} else if err := ctx.Err(); err != nil {
		t.stopped()
		return err
	}
	t.next = to
	if t.next == t.st.SPP {
		t.stopped()
	}
	return nil
}

// stopped tells the observer, if any, that the tile renders no more: finished, or cancelled
// (a lost lease, a shutdown). Either way the worker's slot goes on to its next tile.
func (t *tile) stopped() {
	if t.o != nil {
		t.o.Rendered(time.Now())
	}
}

func (t *tile) sums(n int) []float64 {
	out := make([]float64, 0, 3*t.r.Dx()*t.r.Dy())
	for y := t.r.Y0; y < t.r.Y1; y++ {
		for x := t.r.X0; x < t.r.X1; x++ {
			v := value(t.st, t.frame, x, y)
			out = append(out, v[0]*float64(n), v[1]*float64(n), v[2]*float64(n))
		}
	}
	return out
}

func (t *tile) Export() render.State { return render.State{Next: t.next, Sum: t.sums(t.next)} }

func (t *tile) Import(st render.State) error {
	if err := st.Check(3*t.r.Dx()*t.r.Dy(), t.st.SPP); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	t.next = st.Next
	return nil
}

func (t *tile) Pixels() []float32 {
	out := make([]float32, 3*t.r.Dx()*t.r.Dy())
	if t.next == 0 {
		return out
	}
	for i, s := range t.sums(t.next) {
		out[i] = float32(s / float64(t.next))
	}
	return out
}
