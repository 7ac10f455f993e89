package bench

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/raster"
)

// BenchmarkTiledDenoise measures what denoising an assembled frame gives against Blender's own
// denoised render, on Blender 4.5 (docs/design.md, "Blender scenes", whole frames): the frame
// rendered undenoised with its denoising data, as tiles assemble it exactly, then denoised once
// by Cycles' own denoiser (bpy.ops.cycles.denoise_animation) with the scene's settings. It
// reports the largest and the mean absolute difference of the Combined RGB, and the PSNR over
// the frame's own peak; identical would report max_abs 0. The undenoised input must be
// Blender's own Noisy Image bit for bit, so the difference is the denoiser's alone.
func BenchmarkTiledDenoise(b *testing.B) {
	line := blendertest.LineOf(b, "4.5")
	script := filepath.Join("testdata", "tiled_denoise.py")
	for b.Loop() {
		dir := b.TempDir()
		blendertest.RunWith(b, line.Binary, "--python", script, "--", blendertest.Example(b), dir)
		read := func(name string) *raster.Frame {
			data, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				b.Fatal(err)
			}
			f, _, err := raster.DecodeEXRChannels(data)
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			return f
		}
		own, noisy, after := read("own.exr"), read("noisy.exr"), read("after.exr")
		if !slices.Equal(blendertest.PassRGB(b, own, "Noisy Image"), blendertest.Combined(b, noisy)) {
			b.Fatal("the undenoised frame is not Blender's own Noisy Image: the comparison would not be the denoiser's")
		}
		want, got := blendertest.Combined(b, own), blendertest.Combined(b, after)
		var worst, sum, sq, peak float64
		for i := range want {
			d := math.Abs(float64(got[i]) - float64(want[i]))
			worst, sum, sq, peak = max(worst, d), sum+d, sq+d*d, max(peak, float64(want[i]))
		}
		n := float64(len(want))
		b.ReportMetric(worst, "max_abs")
		b.ReportMetric(sum/n, "mean_abs")
		b.ReportMetric(10*math.Log10(peak*peak/(sq/n)), "psnr_dB")
	}
}
