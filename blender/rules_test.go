package blender_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/blender/blendertest"
	"github.com/tilefarm/tilefarm/render"
)

// plateRanges renders frame 2 of the plate's tile r as Blender writes it: once in one range of
// 16 samples, and in four ranges of 4, each raw as Blender writes it.
func plateRanges(t *testing.T) (sc *blender.Scene, whole []float32, quarters [][]float32, ends []int) {
	t.Helper()
	pool := blendertest.Pool(t, 1)
	sc = load(t, pool, blendertest.Plate(t))
	st, err := sc.Desc.Resolve(render.Overrides{SPP: 16, Passes: 4})
	if err != nil {
		t.Fatal(err)
	}
	r := render.Rect{X0: 10, Y0: 8, X1: 90, Y1: 70}
	tile, err := blender.NewTile(context.Background(), pool, sc, st, 2, r)
	if err != nil {
		t.Fatal(err)
	}
	if whole, err = tile.RenderPass(context.Background(), 0, 16); err != nil {
		t.Fatal(err)
	}
	ends = st.PassEnds(0)
	from := 0
	for _, end := range ends {
		q, err := tile.RenderPass(context.Background(), from, end)
		if err != nil {
			t.Fatal(err)
		}
		quarters = append(quarters, q)
		from = end
	}
	return sc, whole, quarters, ends
}

// worstByChannel is, per channel, the largest |got - want| / max(|want|, 1).
func worstByChannel(names []string, got, want []float32) map[string]float64 {
	out := map[string]float64{}
	k := len(names)
	for i := range got {
		d := math.Abs(float64(got[i])-float64(want[i])) / math.Max(math.Abs(float64(want[i])), 1)
		out[names[i%k]] = math.Max(out[names[i%k]], d)
	}
	return out
}

// Property: each channel of the plate (two view layers; Depth, Mist, Normal, Vector, UV, indexes,
// light passes, Emit, Environment, AO, three Cryptomattes, denoising data, an AOV, a light
// group) combined across four sample ranges by its rule equals one render of all the samples
// within 1e-5 relative; and each rule that is not a mean is needed: combining its channels as a
// mean instead moves some of them by far more.
func TestPassRules(t *testing.T) {
	sc, whole, quarters, ends := plateRanges(t)
	rules := sc.Rules()
	count := map[string]int{}
	for _, r := range rules {
		count[r]++
	}
	t.Logf("rules of the plate's %d channels: %v", len(rules), count)
	names := sc.Desc.Channels
	combined := worstByChannel(names, sc.Combine(quarters, ends, ""), whole)
	for _, rule := range []string{"mean", "first", "weighted", "crypto"} {
		t.Run(rule, func(t *testing.T) {
			var of []string
			for n, r := range rules {
				if r == rule {
					of = append(of, n)
				}
			}
			if len(of) == 0 {
				t.Fatalf("the plate has no channel combined by %s", rule)
			}
			for _, n := range of {
				if combined[n] > 1e-5 {
					t.Errorf("%s (%s) combined from four ranges differs from one render by %g relative", n, rule, combined[n])
				}
			}
			if rule == "mean" {
				return
			}
			asMean := worstByChannel(names, sc.Combine(quarters, ends, rule), whole)
			worst, at := 0.0, ""
			for _, n := range of {
				if asMean[n] > worst {
					worst, at = asMean[n], n
				}
			}
			if worst < 1e-3 {
				t.Fatalf("the %s channels combined as means are within %g of one render: the rule is not needed", rule, worst)
			}
			t.Logf("%s: exact within 1e-5; as a mean, %s is off by %.3g relative", rule, at, worst)
		})
	}
	for n, r := range map[string]string{"Beauty.Depth.Z": "first", "Beauty.IndexOB.X": "first", "Beauty.DiffDir.R": "weighted",
		"FX.Vector.X": "weighted", "Beauty.CryptoObject00.r": "crypto", "Beauty.Denoising Albedo.R": "mean", "Beauty.tint.R": "mean",
		"Beauty.Combined_key.R": "mean", "Beauty.TransDir.R": "weighted", "Beauty.TransInd.G": "weighted", "Beauty.TransCol.B": "mean",
		"Beauty.Position.X": "first", "Beauty.GlossInd.R": "weighted"} {
		if rules[n] != r {
			t.Errorf("%s combines by %q, want %q", n, rules[n], r)
		}
	}
	// Vector is weighted by its layer's alpha: as a plain mean the moving orb's edges are off.
	vec := worstByChannel(names, sc.Combine(quarters, ends, "weighted"), whole)
	if d := math.Max(vec["FX.Vector.X"], vec["FX.Vector.Y"]); d < 1e-4 {
		t.Errorf("FX.Vector as a mean is within %g of one render: the plate shows no motion to test its weighting", d)
	}
	if s := fmt.Sprint(names); !strings.Contains(s, "Beauty.Denoising Depth.Z") {
		t.Errorf("the plate's channels %s lack the denoising data", s)
	}
}
