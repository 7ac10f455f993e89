package render

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// randomSlabCase draws a box, a ray and a tmax, with origins often exactly
// on a slab plane, directions often axis-parallel (±0) or nearly so
// (tiny components whose inverse overflows or is huge), flat boxes and
// infinite tmax.
func randomSlabCase(rng *rand.Rand) (bvhNode, Vec, Vec, float64) {
	c := func() float64 { return rng.Float64()*6 - 3 }
	var n bvhNode
	n.lo = Vec{c(), c(), c()}
	n.hi = n.lo.Add(Vec{rng.Float64() * 2, rng.Float64() * 2, rng.Float64() * 2})
	if rng.IntN(8) == 0 {
		n.hi.Y = n.lo.Y // flat box
	}
	o := Vec{c(), c(), c()}
	on := func(o, l, h float64) float64 {
		switch rng.IntN(4) {
		case 0:
			return l
		case 1:
			return h
		}
		return o
	}
	o = Vec{on(o.X, n.lo.X, n.hi.X), on(o.Y, n.lo.Y, n.hi.Y), on(o.Z, n.lo.Z, n.hi.Z)}
	d := Vec{rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64()}.Normalize()
	comp := func(v float64) float64 {
		switch rng.IntN(10) {
		case 0:
			return 0
		case 1:
			return math.Copysign(0, -1)
		case 2:
			return math.Copysign(1e-300, v) // inverse finite, products overflow
		case 3:
			return math.Copysign(1e-310, v) // subnormal: inverse is ±inf
		}
		return v
	}
	d = Vec{comp(d.X), comp(d.Y), comp(d.Z)}
	if d.X == 0 && d.Y == 0 && d.Z == 0 {
		d.X = 1
	}
	tmax := math.Inf(1)
	if rng.IntN(2) == 0 {
		tmax = rng.Float64() * 8
	}
	return n, o, d, tmax
}

// TestSlabMinMaxMatchesSwap: for every ray traverse gives slabMinMax (all
// inverse components finite), it answers exactly as the compare-and-swap
// test; the others take slabSwap itself. Both kinds must occur, so the
// comparison covers on-plane origins with huge inverses.
func TestSlabMinMaxMatchesSwap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	compared, swapped, hits := 0, 0, 0
	for range 2_000_000 {
		n, o, d, tmax := randomSlabCase(rng)
		inv := Vec{1 / d.X, 1 / d.Y, 1 / d.Z}
		if !finiteInverse(inv) {
			swapped++
			continue
		}
		compared++
		want := slabSwap(&n, o, inv, tmax)
		if want {
			hits++
		}
		if got := slabMinMax(&n, o, inv, tmax); got != want {
			t.Fatalf("box %v-%v, origin %v, dir %v, tmax %v: slabMinMax %v, slabSwap %v", n.lo, n.hi, o, d, tmax, got, want)
		}
	}
	if compared < 100_000 || swapped < 100_000 || hits < compared/20 || hits > compared*19/20 {
		t.Fatalf("weak coverage: %d compared (%d hits), %d left to slabSwap", compared, hits, swapped)
	}
}

// TestSlabAxisParallelRule pins slabSwap's documented NaN rule for a ray
// running inside a face plane of the box: +0 direction component meets the
// box, -0 misses it, on the low and the high plane alike.
func TestSlabAxisParallelRule(t *testing.T) {
	n := bvhNode{lo: Vec{0, 0, 0}, hi: Vec{1, 1, 1}}
	neg0 := math.Copysign(0, -1)
	for _, c := range []struct {
		ox   float64
		dx   float64
		want bool
	}{
		{0, 0, true}, {1, 0, true}, {0, neg0, false}, {1, neg0, false},
		{0.5, 0, true}, {0.5, neg0, true}, {-0.5, 0, false}, {1.5, neg0, false},
	} {
		o := Vec{c.ox, 0.5, -1}
		inv := Vec{1 / c.dx, math.Inf(1), 1} // y parallel too, inside its slab
		for _, tmax := range []float64{10, math.Inf(1)} {
			if got := slabSwap(&n, o, inv, tmax); got != c.want {
				t.Errorf("origin x %v, direction x %v, tmax %v: hit %v, want %v", c.ox, 1/inv.X, tmax, got, c.want)
			}
		}
	}
}

// FuzzSlabMinMax compares the two slab tests on arbitrary finite inputs
// with finite inverse directions.
func FuzzSlabMinMax(f *testing.F) {
	f.Add(0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5, -1.0, 1e-300, 0.0, 1.0, 10.0)
	f.Add(-1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -0.5, 0.5, 0.7, math.Inf(1))
	f.Fuzz(func(t *testing.T, lx, ly, lz, hx, hy, hz, ox, oy, oz, dx, dy, dz, tmax float64) {
		n := bvhNode{lo: Vec{min(lx, hx), min(ly, hy), min(lz, hz)}, hi: Vec{max(lx, hx), max(ly, hy), max(lz, hz)}}
		o := Vec{ox, oy, oz}
		inv := Vec{1 / dx, 1 / dy, 1 / dz}
		for _, v := range []float64{lx, ly, lz, hx, hy, hz, ox, oy, oz} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return
			}
		}
		if !finiteInverse(inv) || math.IsNaN(tmax) || tmax < 0 {
			return
		}
		if got, want := slabMinMax(&n, o, inv, tmax), slabSwap(&n, o, inv, tmax); got != want {
			t.Fatalf("box %v-%v, origin %v, inv %v, tmax %v: slabMinMax %v, slabSwap %v", n.lo, n.hi, o, inv, tmax, got, want)
		}
	})
}

// BenchmarkSlab times both slab tests over the same random (box, ray)
// pairs with finite inverses, alternating, and reports slabSwap's time over
// slabMinMax's (swap/minmax; above 1 means min/max is faster).
func BenchmarkSlab(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	type cs struct {
		n      bvhNode
		o, inv Vec
		tmax   float64
	}
	var cases []cs
	for len(cases) < 4096 {
		n, o, d, tmax := randomSlabCase(rng)
		if d = (Vec{rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64()}); d.IsZero() {
			continue
		}
		inv := Vec{1 / d.X, 1 / d.Y, 1 / d.Z}
		if finiteInverse(inv) {
			cases = append(cases, cs{n, o, inv, tmax})
		}
	}
	var tSwap, tMinMax time.Duration
	hits := 0
	for b.Loop() {
		start := time.Now()
		for i := range cases {
			c := &cases[i]
			if slabSwap(&c.n, c.o, c.inv, c.tmax) {
				hits++
			}
		}
		tSwap += time.Since(start)
		start = time.Now()
		for i := range cases {
			c := &cases[i]
			if slabMinMax(&c.n, c.o, c.inv, c.tmax) {
				hits++
			}
		}
		tMinMax += time.Since(start)
	}
	if hits == 0 {
		b.Fatal("no box was hit")
	}
	b.ReportMetric(tSwap.Seconds()/tMinMax.Seconds(), "swap/minmax")
}
