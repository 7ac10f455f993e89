// Package scenetest holds a kind of scene made for tests: a deterministic gradient rendered
// by a few lines of its own. Registered beside the farm's kinds, it renders through the whole
// farm (submit, JetStream, workers, checkpoints, assembly, outputs) by the scene.Kind interface
// alone, which is what proves a renderer is one package and one registration.
package scenetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/raster"
	"github.com/tilefarm/tilefarm/render"
)

// Format tags a gradient scene's document.
const Format = "tilefarm-gradient/1"

// Ext is the file extension of a gradient scene.
const Ext = ".gradient"

// Document is a gradient scene: its image size, samples per pixel and frame range.
type Document struct {
	Format string `json:"format"`
	Width  int    `json:"width"`
	Height int    `json:"height"`
	SPP    int    `json:"spp"`
	First  int    `json:"first"`
	Last   int    `json:"last"`
}

// Encode is the document as a scene file.
func (d Document) Encode() []byte {
	d.Format = Format
	b, _ := json.Marshal(d) // plain data: cannot fail
	return b
}

// Gradient is the kind of the gradient scenes.
type Gradient struct{}

var _ scene.Kind = Gradient{}

// Name names the kind.
func (Gradient) Name() string { return "gradient scene" }

// ClaimsFile claims the files ending in Ext.
func (Gradient) ClaimsFile(path string) bool { return strings.HasSuffix(path, Ext) }

// ClaimsDocument claims a JSON document tagged Format.
func (Gradient) ClaimsDocument(doc []byte) bool {
	var head struct {
		Format string `json:"format"`
	}
	return bytes.HasPrefix(bytes.TrimSpace(doc), []byte("{")) && json.Unmarshal(doc, &head) == nil && head.Format == Format
}

// Read reads a gradient scene file: a document and no assets.
func (g Gradient) Read(_ context.Context, path string) (*bundle.Bundle, error) {
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
func (Gradient) Describe(doc []byte) (scene.Description, error) { return parse(doc) }

// Validate parses the document; a gradient has no assets.
func (Gradient) Validate(_ context.Context, b *bundle.Bundle) error {
	_, err := parse(b.Scene)
	return err
}

// Load needs nothing of the machine.
func (Gradient) Load(context.Context, *bundle.Bundle, string, string) (scene.Renderer, error) {
	return renderer{}, nil
}

// TileSize is small, so a small frame has many tiles.
func (Gradient) TileSize() int { return 16 }

// Formats are the RGB renderers' formats.
func (Gradient) Formats() []string { return scene.RGBFormats }

// TilePreviews is true: a tile encodes on its own.
func (Gradient) TilePreviews() bool { return true }

// EncodeTilePreview encodes the tile as the frame's 8-bit PNG holds it.
func (Gradient) EncodeTilePreview(r render.Rect, pix []float32, _ render.Settings) ([]byte, error) {
	return raster.EncodePNG8(&raster.Frame{Width: r.Dx(), Height: r.Dy(), Pix: pix}, 0)
}

func parse(doc []byte) (Document, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	var d Document
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("gradient scene: %w", err)
	}
	switch {
	case d.Format != Format:
		return d, fmt.Errorf("gradient scene: format %q, want %q", d.Format, Format)
	case d.Last < d.First:
		return d, fmt.Errorf("gradient scene: frames %d-%d are reversed", d.First, d.Last)
	}
	_, err := d.Resolve(render.Overrides{})
	return d, err
}

// Resolve is the document's settings with the overrides applied.
func (d Document) Resolve(o render.Overrides) (render.Settings, error) {
	st := render.Settings{Camera: "gradient", Width: d.Width, Height: d.Height, SPP: d.SPP, MaxDepth: 1}
	if o.Camera != "" && o.Camera != st.Camera {
		return render.Settings{}, fmt.Errorf("settings.camera: a gradient has only the camera %q", st.Camera)
	}
	if o.Passes != 0 {
		return render.Settings{}, errors.New("settings.passes: a gradient's pixels do not depend on its passes")
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

// Assets are none.
func (d Document) Assets() []string { return nil }

// FrameStep is 1: every frame.
func (d Document) FrameStep() int { return 1 }

// Notes say what the scene is.
func (d Document) Notes(render.Overrides) []string {
	return []string{"a gradient: every pixel is a pure function of its position, frame and sample"}
}

// Sample is sample s of pixel (x, y) of frame: what a tile adds into its sums.
func Sample(st render.Settings, frame, x, y, s int) [3]float64 {
	u := (float64(x) + 0.5) / float64(st.Width)
	v := (float64(y) + 0.5) / float64(st.Height)
	t := float64(s%7) / 7
	return [3]float64{u * (1 + t) / 2, v * (2 - t) / 2, float64(frame%5) / 4}
}

// Pixel is pixel (x, y) of frame as the farm must deliver it: the mean of its samples, summed
// in sample order in float64.
func Pixel(st render.Settings, frame, x, y int) [3]float32 {
	var sum [3]float64
	for s := range st.SPP {
		c := Sample(st, frame, x, y, s)
		for i := range sum {
			sum[i] += c[i]
		}
	}
	var out [3]float32
	for i := range out {
		out[i] = float32(sum[i] / float64(st.SPP))
	}
	return out
}

type renderer struct{}

func (renderer) NewTile(_ context.Context, st render.Settings, frame int, r render.Rect) (scene.Tile, error) {
	if r.X0 < 0 || r.Y0 < 0 || r.X1 > st.Width || r.Y1 > st.Height || r.X0 >= r.X1 || r.Y0 >= r.Y1 {
		return nil, failure.Terminalf("gradient: rect %v outside the %dx%d image", r, st.Width, st.Height)
	}
	return &tile{st: st, frame: frame, r: r, sum: make([]float64, 3*r.Dx()*r.Dy())}, nil
}

// Channels is nil: the gradient is linear RGB.
func (renderer) Channels(render.Settings) []string { return nil }

// Encode encodes as every RGB renderer does, at exposure 0.
func (renderer) Encode(_ context.Context, f *raster.Frame, _ int, _ render.Settings, formats []string) ([]scene.Output, error) {
	return scene.EncodeRGB(f, 0, formats)
}

// tile accumulates its pixels' samples in float64 sums, sample by sample in order, so any
// split of [0, spp) into passes gives the same bits.
type tile struct {
	st    render.Settings
	frame int
	r     render.Rect
	next  int
	sum   []float64
}

func (t *tile) Next() int { return t.next }

func (t *tile) Render(ctx context.Context, from, to int) error {
	if from != t.next || to < from || to > t.st.SPP {
		return fmt.Errorf("gradient: render [%d,%d) of a tile at sample %d of %d", from, to, t.next, t.st.SPP)
	}
	for s := from; s < to; s++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		i := 0
		for y := t.r.Y0; y < t.r.Y1; y++ {
			for x := t.r.X0; x < t.r.X1; x++ {
				c := Sample(t.st, t.frame, x, y, s)
				t.sum[i] += c[0]
				t.sum[i+1] += c[1]
				t.sum[i+2] += c[2]
				i += 3
			}
		}
		t.next = s + 1
	}
	return nil
}

func (t *tile) Export() render.State {
	return render.State{Next: t.next, Sum: append([]float64(nil), t.sum...)}
}

func (t *tile) Import(st render.State) error {
	if err := st.Check(len(t.sum), t.st.SPP); err != nil {
		return fmt.Errorf("gradient: %w", err)
	}
	copy(t.sum, st.Sum)
	t.next = st.Next
	return nil
}

func (t *tile) Pixels() []float32 {
	out := make([]float32, len(t.sum))
	if t.next == 0 {
		return out
	}
	for i, v := range t.sum {
		out[i] = float32(v / float64(t.next))
	}
	return out
}
