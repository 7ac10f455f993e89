package raster

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"image"
	"image/png"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// testFrame returns a w x h frame with a smooth gradient, a few special
// values (negative, NaN, Inf, huge) and some noise.
func testFrame(w, h int, seed uint64) *Frame {
	f := NewFrame(w, h)
	r := rand.New(rand.NewPCG(seed, 1))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			i := (y*w + x) * 3
			f.Pix[i] = float32(x) / float32(w) * 4
			f.Pix[i+1] = float32(y) / float32(h)
			f.Pix[i+2] = r.Float32() * 0.3
		}
	}
	specials := []float32{-1, float32(math.NaN()), float32(math.Inf(1)), 1e30, 0, 0.18, float32(math.Inf(-1)),
		math.Float32frombits(0x7fc12345), float32(math.Copysign(0, -1))}
	for i, v := range specials {
		if i < len(f.Pix) {
			f.Pix[i*7%len(f.Pix)] = v
		}
	}
	return f
}

func TestEncodePNG8(t *testing.T) {
	for _, exposure := range []float64{0, 1.5, -2} {
		f := testFrame(37, 23, 1)
		data, err := EncodePNG8(f, exposure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if img.Bounds() != image.Rect(0, 0, 37, 23) {
			t.Fatalf("bounds %v", img.Bounds())
		}
		cfg, _ := png.DecodeConfig(bytes.NewReader(data))
		if _, ok := img.(*image.RGBA); !ok {
			t.Fatalf("decoded %T (model %v), want 8-bit RGB", img, cfg.ColorModel)
		}
		for y := 0; y < f.Height; y++ {
			for x := 0; x < f.Width; x++ {
				r, g, b, a := img.At(x, y).RGBA()
				i := (y*f.Width + x) * 3
				for c, got := range []uint32{r, g, b} {
					want := uint32(ToneMap8(float64(f.Pix[i+c]), exposure)) * 0x101
					if got != want {
						t.Fatalf("exposure %v pixel (%d,%d) channel %d = %d, want %d", exposure, x, y, c, got>>8, want>>8)
					}
				}
				if a != 0xffff {
					t.Fatalf("pixel (%d,%d) alpha %d", x, y, a)
				}
			}
		}
	}
}

func TestEncodePNG16(t *testing.T) {
	f := testFrame(19, 31, 2)
	data, err := EncodePNG16(f, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := img.(*image.RGBA64); !ok {
		t.Fatalf("decoded %T, want 16-bit RGB", img)
	}
	distinct8 := map[uint32]bool{}
	for y := 0; y < f.Height; y++ {
		for x := 0; x < f.Width; x++ {
			r, g, b, a := img.At(x, y).RGBA()
			i := (y*f.Width + x) * 3
			for c, got := range []uint32{r, g, b} {
				if want := uint32(ToneMap16(float64(f.Pix[i+c]), 0.5)); got != want {
					t.Fatalf("pixel (%d,%d) channel %d = %d, want %d", x, y, c, got, want)
				}
				distinct8[got&0xff] = true
			}
			if a != 0xffff {
				t.Fatalf("alpha %d", a)
			}
		}
	}
	if len(distinct8) < 32 {
		t.Fatalf("low bytes take only %d values: not really 16-bit", len(distinct8))
	}
}

func TestEncodePNGRejects(t *testing.T) {
	if _, err := EncodePNG8(&Frame{Width: 2, Height: 2, Pix: make([]float32, 11)}, 0); err == nil {
		t.Error("inconsistent frame encoded")
	}
	if _, err := EncodePNG16(NewFrame(1, 1), math.NaN()); err == nil {
		t.Error("NaN exposure accepted")
	}
	if _, err := EncodePNG8(nil, 0); err == nil {
		t.Error("nil frame encoded")
	}
}

func TestEXRRoundTrip(t *testing.T) {
	sizes := [][2]int{{1, 1}, {37, 21}, {64, 16}, {5, 33}, {128, 64}}
	for _, comp := range []EXRCompression{EXRNone, EXRZip} {
		for _, sz := range sizes {
			f := testFrame(sz[0], sz[1], uint64(sz[0]*1000+sz[1]))
			data, err := EncodeEXR(f, comp)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeEXR(data)
			if err != nil {
				t.Fatalf("%s %dx%d: %v", comp, sz[0], sz[1], err)
			}
			if got.Width != f.Width || got.Height != f.Height || len(got.Pix) != len(f.Pix) {
				t.Fatalf("%s: decoded %dx%d", comp, got.Width, got.Height)
			}
			for i := range f.Pix {
				if math.Float32bits(got.Pix[i]) != math.Float32bits(f.Pix[i]) {
					t.Fatalf("%s %dx%d value %d: bits %08x, want %08x", comp, sz[0], sz[1], i,
						math.Float32bits(got.Pix[i]), math.Float32bits(f.Pix[i]))
				}
			}
		}
	}
}

// TestEXRLayout checks the file against the OpenEXR specification by hand:
// magic, version, required attributes, offset table, and the ZIP chunk
// preprocessing reversed independently of the package's decoder.
func TestEXRLayout(t *testing.T) {
	f := NewFrame(3, 20)
	for i := range f.Pix {
		f.Pix[i] = float32(i%3) + float32(i/3)*0.25 // R = 0+k/4, G = 1+k/4, B = 2+k/4 for pixel k
	}
	for _, comp := range []EXRCompression{EXRNone, EXRZip} {
		data, err := EncodeEXR(f, comp)
		if err != nil {
			t.Fatal(err)
		}
		le := binary.LittleEndian
		if le.Uint32(data) != 20000630 || le.Uint32(data[4:]) != 2 {
			t.Fatalf("%s: magic/version % x", comp, data[:8])
		}
		for _, attr := range []string{"channels\x00chlist\x00", "compression\x00compression\x00\x01\x00\x00\x00" + string([]byte{byte(comp)}),
			"dataWindow\x00box2i\x00", "displayWindow\x00box2i\x00", "lineOrder\x00lineOrder\x00\x01\x00\x00\x00\x00",
			"pixelAspectRatio\x00float\x00", "screenWindowCenter\x00v2f\x00", "screenWindowWidth\x00float\x00",
			"B\x00\x02\x00\x00\x00", "G\x00\x02\x00\x00\x00", "R\x00\x02\x00\x00\x00"} {
			if !bytes.Contains(data, []byte(attr)) {
				t.Fatalf("%s: header lacks %q", comp, attr)
			}
		}
		hdrEnd := bytes.Index(data, []byte("screenWindowWidth\x00float\x00\x04\x00\x00\x00")) + len("screenWindowWidth\x00float\x00\x04\x00\x00\x00") + 4
		if data[hdrEnd] != 0 {
			t.Fatalf("%s: header not terminated where expected", comp)
		}
		lines := 1
		if comp == EXRZip {
			lines = 16
		}
		chunks := (20 + lines - 1) / lines
		table := data[hdrEnd+1:]
		for c := 0; c < chunks; c++ {
			off := le.Uint64(table[8*c:])
			y := int32(le.Uint32(data[off:]))
			size := le.Uint32(data[off+4:])
			payload := data[off+8 : off+8+uint64(size)]
			if int(y) != c*lines {
				t.Fatalf("%s chunk %d starts at y=%d", comp, c, y)
			}
			n := min(lines, 20-c*lines)
			raw := payload
			if comp == EXRZip && int(size) < n*3*3*4 {
				raw = unzipIndependently(t, payload)
			}
			if len(raw) != n*3*3*4 {
				t.Fatalf("%s chunk %d: %d bytes", comp, c, len(raw))
			}
			// Scanline layout: all B values, then G, then R.
			for k := 0; k < n; k++ {
				row := raw[k*36:]
				for ci, want := range []float32{2, 1, 0} {
					for x := 0; x < 3; x++ {
						pixel := (c*lines+k)*3 + x
						got := math.Float32frombits(le.Uint32(row[(ci*3+x)*4:]))
						if got != want+float32(pixel)*0.25 {
							t.Fatalf("%s y=%d x=%d channel %d = %v", comp, c*lines+k, x, ci, got)
						}
					}
				}
			}
		}
	}
}

// unzipIndependently reverses OpenEXR's ZIP chunk encoding as written in the
// reference implementation (zlib, then predictor, then de-interleave).
func unzipIndependently(t *testing.T, payload []byte) []byte {
	t.Helper()
	zr, err := zlib.NewReader(bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	var tmp bytes.Buffer
	if _, err := tmp.ReadFrom(zr); err != nil {
		t.Fatal(err)
	}
	b := tmp.Bytes()
	for i := 1; i < len(b); i++ {
		b[i] = byte(int(b[i-1]) + int(b[i]) - 128)
	}
	out := make([]byte, len(b))
	t1, t2 := 0, (len(b)+1)/2
	for i := 0; i < len(b); i++ {
		if i%2 == 0 {
			out[i] = b[t1]
			t1++
		} else {
			out[i] = b[t2]
			t2++
		}
	}
	return out
}

func TestEXRZipCompresses(t *testing.T) {
	f := NewFrame(256, 64)
	for i := range f.Pix {
		f.Pix[i] = float32(i/3%256) / 256
	}
	none, err := EncodeEXR(f, EXRNone)
	if err != nil {
		t.Fatal(err)
	}
	zip, err := EncodeEXR(f, EXRZip)
	if err != nil {
		t.Fatal(err)
	}
	if len(zip) > len(none)/4 {
		t.Fatalf("ZIP file %d bytes vs %d uncompressed: compression ineffective", len(zip), len(none))
	}
}

func TestDecodeEXRRejects(t *testing.T) {
	good, err := EncodeEXR(testFrame(20, 20, 3), EXRZip)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty":     nil,
		"not exr":   []byte("\x89PNG\r\n\x1a\n...."),
		"truncated": good[:len(good)-10],
		"header":    good[:60],
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)-5] ^= 0xff // inside the last zlib stream: checksum or inflate error
	cases["corrupt chunk"] = flipped
	huge := bytes.Clone(good)
	i := bytes.Index(huge, []byte("dataWindow\x00box2i\x00")) + len("dataWindow\x00box2i\x00") + 4
	binary.LittleEndian.PutUint32(huge[i+8:], 16000) // xMax
	binary.LittleEndian.PutUint32(huge[i+12:], 16000)
	cases["window larger than file"] = huge
	for name, data := range cases {
		if _, err := DecodeEXR(data); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := EncodeEXR(NewFrame(2, 2), EXRCompression(7)); err == nil {
		t.Error("EncodeEXR accepted an unsupported compression")
	}
}

func FuzzDecodeEXR(f *testing.F) {
	for _, comp := range []EXRCompression{EXRNone, EXRZip} {
		data, err := EncodeEXR(testFrame(7, 18, 9), comp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := DecodeEXR(data)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to the same bits.
		again, err := EncodeEXR(fr, EXRZip)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeEXR(again)
		if err != nil {
			t.Fatal(err)
		}
		for i := range fr.Pix {
			if math.Float32bits(back.Pix[i]) != math.Float32bits(fr.Pix[i]) {
				t.Fatal("re-encoding changed the pixels")
			}
		}
	})
}

// A frame of named channels (a Blender frame's layers and passes) and its header strings
// survive EncodeEXR and DecodeEXRChannels bit for bit, in the file's sorted order, with names
// long enough to need the long-names flag.
func TestEXRNamedChannelsRoundTrip(t *testing.T) {
	names := []string{"ViewLayer.Combined.R", "ViewLayer.Combined.G", "ViewLayer.Combined.B", "ViewLayer.Combined.A",
		"ViewLayer.Depth.Z", "AVeryLongViewLayerNameIndeed.Denoising Albedo.R"}
	f := NewFrameOf(5, 3, names)
	for i := range f.Pix {
		f.Pix[i] = float32(i)*0.37 - 2
	}
	attrs := map[string]string{"cryptomatte/abc1234/name": "ViewLayer.CryptoObject", "cryptomatte/abc1234/manifest": `{"Cube":"3f800000"}`}
	for _, c := range []EXRCompression{EXRNone, EXRZip} {
		data, err := EncodeEXR(f, c, attrs)
		if err != nil {
			t.Fatal(err)
		}
		g, got, err := DecodeEXRChannels(data)
		if err != nil {
			t.Fatal(err)
		}
		sorted := slices.Sorted(slices.Values(names))
		if !slices.Equal(g.Names, sorted) {
			t.Fatalf("names %q, want %q", g.Names, sorted)
		}
		for y := 0; y < f.Height; y++ {
			for x := 0; x < f.Width; x++ {
				for ci, n := range names {
					gi := slices.Index(g.Names, n)
					if a, b := f.Pix[(y*f.Width+x)*len(names)+ci], g.Pix[(y*g.Width+x)*len(names)+gi]; math.Float32bits(a) != math.Float32bits(b) {
						t.Fatalf("%s at (%d,%d): %v, want %v", n, x, y, b, a)
					}
				}
			}
		}
		for k, v := range attrs {
			if got[k] != v {
				t.Fatalf("attribute %s = %q, want %q", k, got[k], v)
			}
		}
		// The RGB reader refuses a file without R, G and B rather than inventing them.
		if _, err := DecodeEXR(data); err == nil {
			t.Fatal("DecodeEXR read a file with no R channel")
		}
	}
	if err := NewFrameOf(2, 2, names).Place(0, 0, 1, 1, make([]float32, 3)); err == nil {
		t.Fatal("Place took 3 values for a pixel of 6 channels")
	}
	if _, err := EncodePNG8(NewFrameOf(2, 2, names), 0); err == nil {
		t.Fatal("EncodePNG8 encoded a frame of passes as RGB")
	}
}
