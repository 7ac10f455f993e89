package raster

import (
	"bytes"
	"fmt"
	"image"
	"image/png"
	"math"
)

// EncodePNG8 tone-maps f (see ToneMap) and encodes it as an opaque 8-bit sRGB PNG.
func EncodePNG8(f *Frame, exposure float64) ([]byte, error) {
	if err := checkExposure(f, exposure); err != nil {
		return nil, fmt.Errorf("encoding PNG: %w", err)
	}
	img := image.NewNRGBA(image.Rect(0, 0, f.Width, f.Height))
	for i, j := 0, 0; i < len(f.Pix); i, j = i+3, j+4 {
		img.Pix[j] = ToneMap8(float64(f.Pix[i]), exposure)
		img.Pix[j+1] = ToneMap8(float64(f.Pix[i+1]), exposure)
		img.Pix[j+2] = ToneMap8(float64(f.Pix[i+2]), exposure)
		img.Pix[j+3] = 0xff
	}
	return encodePNG(img)
}

// EncodePNG16 tone-maps f (see ToneMap) and encodes it as an opaque 16-bit sRGB PNG.
func EncodePNG16(f *Frame, exposure float64) ([]byte, error) {
	if err := checkExposure(f, exposure); err != nil {
		return nil, fmt.Errorf("encoding PNG: %w", err)
	}
	img := image.NewNRGBA64(image.Rect(0, 0, f.Width, f.Height))
	for i, j := 0, 0; i < len(f.Pix); i, j = i+3, j+8 {
		for c := 0; c < 3; c++ {
			v := ToneMap16(float64(f.Pix[i+c]), exposure)
			img.Pix[j+2*c] = uint8(v >> 8)
			img.Pix[j+2*c+1] = uint8(v)
		}
		img.Pix[j+6], img.Pix[j+7] = 0xff, 0xff
	}
	return encodePNG(img)
}

func checkExposure(f *Frame, exposure float64) error {
	if err := f.check(); err != nil {
		return err
	}
	if !f.IsRGB() {
		return fmt.Errorf("a frame of %d channels is not an RGB image", f.Chans())
	}
	if math.IsNaN(exposure) || math.IsInf(exposure, 0) || math.Abs(exposure) > 64 {
		return fmt.Errorf("exposure %v out of range [-64,64]", exposure)
	}
	return nil
}

func encodePNG(img image.Image) ([]byte, error) {
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.DefaultCompression}
	if err := enc.Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("encoding PNG: %w", err)
	}
	return buf.Bytes(), nil
}
