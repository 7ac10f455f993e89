package render

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"
)

// Equal-time noise of the current sampler (Owen-scrambled Sobol) against
// pt-1's hashed white noise (whiteNoise) on the bundled examples.
//
// Method: both samplers render the same frame at the example's own samples
// per pixel (cornell 32, shot 16) with noiseSeeds different seeds; each render is timed, and its MSE is taken
// against a reference rendered once per process with the current sampler at
// 2·noiseRefHalf spp with seeds no test render uses (so its error is
// independent of theirs). White noise is plain Monte Carlo: its MSE falls as
// 1/samples, so at the time the Sobol renders took, the white-noise MSE
// would be MSE_white·t_white/t_sobol. The reported equal-time ratio is hence
//
//	mse-ratio = (MSE_white · t_white) / (MSE_sobol · t_sobol)
//
// i.e. the ratio of efficiencies 1/(MSE·time). The reference is the mean of
// two independent halves a and b; its own noise variance is estimated as
// mean((a-b)²)/4 and reported relative to the Sobol MSE (ref-noise/mse-sobol),
// so a reference too noisy to trust shows.
//
// Two errors are reported. mse-ratio takes every value clamped to [0, 1],
// the range a PNG shows: a rare caustic path through a glass sphere to a
// small bright light (a firefly) can carry most of an unclamped frame's
// error, and with a handful of renders its chance presence in one render
// decides the unclamped ratio. linear-mse-ratio is the same over unclamped
// radiance (what an EXR holds); it converges more slowly over runs.

const (
	noiseSeeds   = 12
	noiseRefHalf = 1024
	noiseRefSeed = 1 << 40 // reference seeds: noiseRefSeed and noiseRefSeed+1
)

// noiseCase is one example frame of the equal-time benchmark.
type noiseCase struct {
	name  string
	frame int
	w, h  int
}

// noiseRef caches each case's reference (and its noise estimate) for the
// process, so -count repeats do not render it again.
var noiseRef = struct {
	sync.Mutex
	px    map[string][]float64
	noise map[string]float64
}{px: map[string][]float64{}, noise: map[string]float64{}}

func BenchmarkEqualTimeNoise(b *testing.B) {
	for _, c := range []noiseCase{{"cornell", 1, 48, 48}, {"shot", 1, 64, 36}} {
		b.Run(c.name, func(b *testing.B) {
			s := loadExample(b, c.name)
			ref, refNoise := noiseReference(b, s, c)
			var tWhite, tSobol time.Duration
			var eWhite, eSobol, lWhite, lSobol float64
			runs := 0
			b.ResetTimer()
			for b.Loop() {
				for k := range noiseSeeds {
					st := small(s, c.w, c.h, s.Defaults().SPP)
					st.Seed = uint64(100 + k)
					// Alternate the order so drifting load hits both alike.
					order := []func(uint64, uint32, uint64) float64{whiteNoise, nil}
					if k%2 == 1 {
						order[0], order[1] = nil, whiteNoise
					}
					for _, legacy := range order {
						start := time.Now()
						px := renderFrame(b, s, st, c.frame, legacy)
						d := time.Since(start)
						e, l := mse(px, ref, 1), mse(px, ref, math.Inf(1))
						if legacy == nil {
							tSobol, eSobol, lSobol = tSobol+d, eSobol+e, lSobol+l
						} else {
							tWhite, eWhite, lWhite = tWhite+d, eWhite+e, lWhite+l
						}
					}
				}
				runs++
			}
			if eSobol == 0 || tSobol == 0 {
				b.Fatal("no error or no time measured for the Sobol sampler")
			}
			n := float64(runs * noiseSeeds)
			b.ReportMetric(eWhite*tWhite.Seconds()/(eSobol*tSobol.Seconds()), "mse-ratio")
			b.ReportMetric(eWhite/eSobol, "mse-ratio-equal-spp")
			b.ReportMetric(lWhite*tWhite.Seconds()/(lSobol*tSobol.Seconds()), "linear-mse-ratio")
			b.ReportMetric(tSobol.Seconds()/tWhite.Seconds(), "time-sobol/white")
			b.ReportMetric(lSobol/n, "mse-sobol")
			b.ReportMetric(refNoise/(lSobol/n), "ref-noise/mse-sobol")
		})
	}
}

// noiseReference returns the case's reference frame (float64 RGB) and the
// estimated variance of its own noise per value.
func noiseReference(b *testing.B, s *Scene, c noiseCase) ([]float64, float64) {
	noiseRef.Lock()
	defer noiseRef.Unlock()
	if px, ok := noiseRef.px[c.name]; ok {
		return px, noiseRef.noise[c.name]
	}
	halves := make([][]float32, 2)
	var wg sync.WaitGroup
	for i := range halves {
		wg.Go(func() {
			st := small(s, c.w, c.h, noiseRefHalf)
			st.Seed = noiseRefSeed + uint64(i)
			halves[i] = renderFrame(b, s, st, c.frame, nil)
		})
	}
	wg.Wait()
	ref := make([]float64, len(halves[0]))
	d2 := 0.0
	for i := range ref {
		a, bb := float64(halves[0][i]), float64(halves[1][i])
		ref[i] = (a + bb) / 2
		d2 += (a - bb) * (a - bb)
	}
	noise := d2 / float64(len(ref)) / 4
	noiseRef.px[c.name], noiseRef.noise[c.name] = ref, noise
	return ref, noise
}

// renderFrame renders a whole frame as one tile with the given legacy
// sampler (nil: the current one).
func renderFrame(b *testing.B, s *Scene, st Settings, frame int, legacy func(uint64, uint32, uint64) float64) []float32 {
	tl, err := NewTile(s, st, frame, Rect{0, 0, st.Width, st.Height})
	if err != nil {
		b.Error(err)
		return nil
	}
	tl.legacy = legacy
	if err := tl.Render(context.Background(), 0, st.SPP); err != nil {
		b.Error(err)
		return nil
	}
	return tl.Pixels()
}

// mse is the mean squared error of px against ref over every value, both
// clamped to at most hi.
func mse(px []float32, ref []float64, hi float64) float64 {
	sum := 0.0
	for i, v := range px {
		d := min(float64(v), hi) - min(ref[i], hi)
		sum += d * d
	}
	return sum / float64(len(px))
}
