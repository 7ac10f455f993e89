package raster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// maxFramePixels bounds a frame so that a bad header or setting cannot make
// the assembler allocate without limit (16384 x 16384).
const maxFramePixels = 1 << 28

// Frame is an assembled, linear, untonemapped image: Pix holds Width*Height*Chans() float32
// values, interleaved, row-major, y=0 at the top. Names are the channels of a frame of more
// than linear RGB (a Blender frame's view layers and passes, "Layer.Pass.Channel"); nil names
// R, G and B.
type Frame struct {
	Width, Height int
	Names         []string
	Pix           []float32
}

// rgb are the channels of a frame with no Names.
var rgb = []string{"R", "G", "B"}

// Chans is the number of values per pixel.
func (f *Frame) Chans() int {
	if f.Names == nil {
		return 3
	}
	return len(f.Names)
}

// ChannelNames returns the frame's channel names, R, G, B for an RGB frame.
func (f *Frame) ChannelNames() []string {
	if f.Names == nil {
		return rgb
	}
	return f.Names
}

// IsRGB reports whether the frame holds linear RGB alone.
func (f *Frame) IsRGB() bool { return f.Names == nil }

// NewFrame returns a black frame of w x h pixels. It panics on sizes that
// could not have passed scene validation; use ValidateSize for user input.
func NewFrame(w, h int) *Frame { return NewFrameOf(w, h, nil) }

// NewFrameOf returns a frame of w x h pixels of the named channels (nil: R, G, B), zero
// everywhere. Like NewFrame it panics on sizes scene validation refuses.
func NewFrameOf(w, h int, names []string) *Frame {
	if err := ValidateSize(w, h); err != nil {
		panic(err)
	}
	f := &Frame{Width: w, Height: h, Names: names}
	f.Pix = make([]float32, w*h*f.Chans())
	return f
}

// Without returns a copy of f without the channels named in drop (f itself if it has none of
// them): the channels a renderer needs only while it renders, left out of the written frame.
func (f *Frame) Without(drop []string) *Frame {
	names := f.ChannelNames()
	var keep []int
	for i, n := range names {
		if !slices.Contains(drop, n) {
			keep = append(keep, i)
		}
	}
	if len(keep) == len(names) {
		return f
	}
	out := &Frame{Width: f.Width, Height: f.Height, Names: make([]string, len(keep)), Pix: make([]float32, 0, f.Width*f.Height*len(keep))}
	for j, i := range keep {
		out.Names[j] = names[i]
	}
	c := len(names)
	for px := 0; px+c <= len(f.Pix); px += c {
		for _, i := range keep {
			out.Pix = append(out.Pix, f.Pix[px+i])
		}
	}
	return out
}

// ValidateSize checks that w x h is a frame size the package can hold.
func ValidateSize(w, h int) error {
	if w <= 0 || h <= 0 {
		return fmt.Errorf("frame size %dx%d: width and height must be positive", w, h)
	}
	if int64(w)*int64(h) > maxFramePixels {
		return fmt.Errorf("frame size %dx%d: more than %d pixels", w, h, maxFramePixels)
	}
	return nil
}

// check reports whether the frame's buffer matches its size.
func (f *Frame) check() error {
	if f == nil {
		return errors.New("nil frame")
	}
	if err := ValidateSize(f.Width, f.Height); err != nil {
		return err
	}
	if f.Names != nil && len(f.Names) == 0 {
		return fmt.Errorf("frame %dx%d: no channels", f.Width, f.Height)
	}
	if n := f.Width * f.Height * f.Chans(); len(f.Pix) != n {
		return fmt.Errorf("frame %dx%d: %d values, want %d", f.Width, f.Height, len(f.Pix), n)
	}
	return nil
}

// Place copies a tile's buffer (interleaved, row-major, (x1-x0)*(y1-y0)*Chans()
// values) into the half-open rectangle [x0,x1) x [y0,y1) of the frame.
func (f *Frame) Place(x0, y0, x1, y1 int, pix []float32) error {
	if err := f.check(); err != nil {
		return fmt.Errorf("placing tile: %w", err)
	}
	if x0 < 0 || y0 < 0 || x1 > f.Width || y1 > f.Height || x0 >= x1 || y0 >= y1 {
		return fmt.Errorf("placing tile [%d,%d)x[%d,%d): outside the %dx%d frame or empty", x0, x1, y0, y1, f.Width, f.Height)
	}
	w, h, c := x1-x0, y1-y0, f.Chans()
	if len(pix) != w*h*c {
		return fmt.Errorf("placing tile [%d,%d)x[%d,%d): %d values, want %d", x0, x1, y0, y1, len(pix), w*h*c)
	}
	for y := 0; y < h; y++ {
		dst := ((y0+y)*f.Width + x0) * c
		copy(f.Pix[dst:dst+w*c], pix[y*w*c:(y+1)*w*c])
	}
	return nil
}

// EncodeTile serialises a tile's float32 buffer as little-endian IEEE 754
// values, the layout tile objects are stored in (bit-exact, no conversion).
func EncodeTile(pix []float32) []byte {
	b := make([]byte, 4*len(pix))
	for i, v := range pix {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// DecodeTile parses a buffer written by EncodeTile that must hold exactly n values.
func DecodeTile(b []byte, n int) ([]float32, error) {
	if n < 0 || n > math.MaxInt/4 || len(b) != 4*n {
		return nil, fmt.Errorf("decoding tile: %d bytes, want %d for %d values", len(b), 4*n, n)
	}
	pix := make([]float32, n)
	for i := range pix {
		pix[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return pix, nil
}
