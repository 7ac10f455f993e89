package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"

	"github.com/tilefarm/tilefarm/internal/flight"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/objstore"
)

// A finished frame's thumbnail, for the monitor's contact sheet (docs/web.md, "Job"): the
// frame's PNG, which every frame has (a Blender scene's is its Composite, through its colour
// management), scaled down by a box filter. A frame's PNG never changes once promoted, so each
// thumbnail is made once and kept in memory by frame key, at most maxThumbnails of them, and
// at most thumbnailWorkers are made at once: a viewer opening a shot of hundreds of finished
// frames costs the coordinator one core at most while they are made.
const (
	// ThumbnailEdge bounds a thumbnail's width and height.
	ThumbnailEdge    = 160
	maxThumbnails    = 512
	thumbnailWorkers = 1
)

// thumbnails are the thumbnails made, by frame key, and the tokens of the makers.
type thumbnails struct {
	cache *flight.Cache[[]byte]
	work  chan struct{}
}

func newThumbnails() *thumbnails {
	return &thumbnails{cache: flight.New[[]byte](maxThumbnails), work: make(chan struct{}, thumbnailWorkers)}
}

// Thumbnail returns a thumbnail of a job's finished frame as a PNG (ThumbnailOf of the frame's
// PNG): a frame whose PNG is not promoted yet is api.ErrNotReady.
func (c *Coordinator) Thumbnail(ctx context.Context, jobID string, frame int) ([]byte, error) {
	fk, err := c.frameDone(ctx, jobID, frame, "png")
	if err != nil {
		return nil, err
	}
	return c.thumbs.cache.Get(ctx, fk, func(ctx context.Context) ([]byte, error) {
		select {
		case c.thumbs.work <- struct{}{}:
			defer func() { <-c.thumbs.work }()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		data, err := c.readFrameObject(ctx, fk, frame, "png", mustOutputName("png"))
		if err != nil {
			return nil, err
		}
		img, err := png.Decode(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("decoding the PNG of frame %d: %w: %v", frame, objstore.ErrCorrupt, err)
		}
		var out bytes.Buffer
		if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&out, ThumbnailOf(img)); err != nil {
			return nil, fmt.Errorf("encoding the thumbnail of frame %d: %w", frame, err)
		}
		return out.Bytes(), nil
	})
}

func mustOutputName(format string) string {
	name, _ := layout.FrameOutputName(format)
	return name
}

// ThumbnailOf scales img down by a box filter to fit ThumbnailEdge: with k the smallest whole
// factor that fits (ceil(max(width, height) / ThumbnailEdge), at least 1), the thumbnail is
// ceil(width/k) x ceil(height/k), and its pixel (i, j) is the mean of img's pixels (x, y) with
// k·i <= x < min(k·i+k, width) and k·j <= y < min(k·j+k, height), per channel of 8-bit
// non-premultiplied RGBA (color.NRGBAModel), rounded half up: (sum + n/2) / n in integers.
// The monitor's test holds the thumbnail drawn to this definition, pixel for pixel.
func ThumbnailOf(img image.Image) *image.NRGBA {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	k := max(1, (max(w, h)+ThumbnailEdge-1)/ThumbnailEdge)
	tw, th := (w+k-1)/k, (h+k-1)/k
	out := image.NewNRGBA(image.Rect(0, 0, tw, th))
	sums := make([]uint64, 4*tw)
	counts := make([]uint64, tw)
	for ty := range th {
		clear(sums)
		clear(counts)
		for y := ty * k; y < min(ty*k+k, h); y++ {
			for x := range w {
				p := nrgbaAt(img, b.Min.X+x, b.Min.Y+y)
				s := sums[4*(x/k):]
				s[0] += uint64(p.R)
				s[1] += uint64(p.G)
				s[2] += uint64(p.B)
				s[3] += uint64(p.A)
				counts[x/k]++
			}
		}
		row := out.Pix[ty*out.Stride:]
		for tx := range tw {
			n := counts[tx]
			for ch := range 4 {
				row[4*tx+ch] = uint8((sums[4*tx+ch] + n/2) / n)
			}
		}
	}
	return out
}

// nrgbaAt is img's pixel as color.NRGBAModel converts it, without the conversion for the
// layouts the farm's PNGs decode to.
func nrgbaAt(img image.Image, x, y int) color.NRGBA {
	switch m := img.(type) {
	case *image.NRGBA:
		i := m.PixOffset(x, y)
		return color.NRGBA{m.Pix[i], m.Pix[i+1], m.Pix[i+2], m.Pix[i+3]}
	case *image.RGBA:
		i := m.PixOffset(x, y)
		if m.Pix[i+3] == 0xff {
			return color.NRGBA{m.Pix[i], m.Pix[i+1], m.Pix[i+2], 0xff}
		}
	}
	return color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
}
