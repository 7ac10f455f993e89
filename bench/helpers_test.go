package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// errMismatch means the farm (or a resumed tile) produced other pixels than the reference: the
// benchmark measured the wrong work, so its numbers are meaningless.
var errMismatch = errors.New("output differs from the reference")

// examplePath is the scene file of one of the repository's examples.
func examplePath(name string) string {
	return filepath.Join("..", "examples", name, "scene.json")
}

// loadBundle reads an example's scene bundle once, outside any timed region.
func loadBundle(tb testing.TB, name string) *bundle.Bundle {
	tb.Helper()
	b, err := jsonscene.ReadFile(context.Background(), examplePath(name))
	if err != nil {
		tb.Fatalf("loading example %q: %v", name, err)
	}
	return b
}

// quietLogger drops the farm's logs: benchmark output stays readable, and correctness is checked
// by comparing pixels and counting attempts instead of reading logs.
func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// reporter is what a benchmark reports metrics through: *testing.B, or a metricSet in the smoke
// test, so both run the same reporting code.
type reporter interface {
	ReportMetric(n float64, unit string)
}

// metricSet collects reported metrics by unit.
type metricSet map[string]float64

// ReportMetric records n under unit.
func (m metricSet) ReportMetric(n float64, unit string) { m[unit] = n }

// ratio divides two durations, the way every speed in this package is reported.
func ratio(num, den time.Duration) float64 {
	return num.Seconds() / den.Seconds()
}

// rate is events per second.
func rate(events int, d time.Duration) float64 {
	return float64(events) / d.Seconds()
}

// finitePositive reports whether v is a usable ratio or rate.
func finitePositive(v float64) bool {
	return v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v)
}

// samePNG compares two PNG images by decoded pixels (never by bytes: PNG encoders may differ in bytes for the same pixels).
func samePNG(got, want []byte) error {
	g, err := png.Decode(bytes.NewReader(got))
	if err != nil {
		return fmt.Errorf("decoding farm output: %w", err)
	}
	w, err := png.Decode(bytes.NewReader(want))
	if err != nil {
		return fmt.Errorf("decoding reference: %w", err)
	}
	if g.Bounds() != w.Bounds() {
		return fmt.Errorf("%w: bounds %v, want %v", errMismatch, g.Bounds(), w.Bounds())
	}
	return samePixels(g, w)
}

func samePixels(g, w image.Image) error {
	r := g.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			gr, gg, gb, ga := g.At(x, y).RGBA()
			wr, wg, wb, wa := w.At(x, y).RGBA()
			if gr != wr || gg != wg || gb != wb || ga != wa {
				return fmt.Errorf("%w: pixel (%d,%d) is %v, want %v", errMismatch, x, y, g.At(x, y), w.At(x, y))
			}
		}
	}
	return nil
}

// jsonKinds are the scene kinds of the benchmarks that render tilefarm JSON scenes.
var jsonKinds = scene.Kinds{jsonscene.Kind{}}
