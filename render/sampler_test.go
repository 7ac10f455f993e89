package render

import (
	"math"
	"testing"
)

// whiteNoise is the sampler of render version pt-1, kept only for tests and
// the equal-time benchmark: hashed white noise, every number an independent
// hash of (pixel key, sample index, dimension). It maps the pair layout of
// the current integrator back onto pt-1's dimension order, so a tile using it
// renders exactly the pt-1 pixels (TestWhiteNoiseIsPT1 holds it to that).
func whiteNoise(key uint64, idx uint32, d uint64) float64 {
	k := hashCombine(key, uint64(idx))
	if d >= dimBounce0 {
		// pt-1 read a bounce's block as pick, light uv, bsdf (3), roulette.
		off := (d - dimBounce0) % dimPerHop
		d += pt1Hop[off] - off
	}
	return float64(mix64(k+d*golden)>>11) * (1.0 / (1 << 53))
}

// pt1Hop maps an offset in the current bounce block to pt-1's offset.
var pt1Hop = [dimPerHop]uint64{
	hopLight: 1, hopLight + 1: 2,
	hopBSDF: 3, hopBSDF + 1: 4,
	hopPick: 0, hopRoulette: 6,
	6: 5, 7: 7, // unused now: pt-1's third BSDF number and its spare
}

// TestWhiteNoiseIsPT1 renders the pt-1 golden cases with whiteNoise: the
// benchmark's "old sampler" must be the old renderer, bit for bit.
func TestWhiteNoiseIsPT1(t *testing.T) {
	pt1 := []string{
		"4914f9125c4714e1818d0275197dd7ff655a74676b251bd8fa75a3c4264e95d2",
		"f8a1e47647c451b9c609bcdd3b10e930ec743cd578fa5aa3e1e29432832e976d",
		"0f9273c7079fe90bb20ade121b44c74b79022f4cd0aabb2e5d4d108fb4530715",
	}
	if !goldenArch() {
		t.Skip("the pt-1 hashes are pinned for amd64 only")
	}
	cases := []struct {
		name  string
		frame int
	}{{"cornell", 1}, {"shot", 1}, {"shot", 17}}
	for i, c := range cases {
		s := loadExample(t, c.name)
		px := renderWith(t, s, small(s, 64, 48, 4), c.frame, 32, whiteNoise)
		if got := hashPixels(px); got != pt1[i] {
			t.Errorf("%s frame %d with whiteNoise: sha256 %s, want pt-1's %s", c.name, c.frame, got, pt1[i])
		}
	}
}

// TestSamplerNets checks the stratification the sampler promises: for
// several pixels and pairs of dimensions, the first 2^m samples of a pair
// form a (0,m,2)-net (exactly one point in every elementary interval of
// area 2^-m), and so do those of each single dimension in 2^m equal
// intervals. Independent random numbers fail this almost surely.
func TestSamplerNets(t *testing.T) {
	fk := frameKey(7, 3)
	for _, px := range [][2]int{{0, 0}, {17, 5}, {1919, 1079}} {
		for _, pair := range []uint64{0, 1, 2, 5, 63} {
			for _, m := range []int{1, 4, 7} {
				n := 1 << m
				pts := make([][2]float64, n)
				for i := range n {
					s := newSampler(fk, px[0], px[1], i)
					pts[i] = [2]float64{s.at(2 * pair), s.at(2*pair + 1)}
				}
				for a := 0; a <= m; a++ {
					nx, ny := 1<<a, 1<<(m-a)
					seen := make([]int, n)
					for _, p := range pts {
						seen[int(p[0]*float64(nx))*ny+int(p[1]*float64(ny))]++
					}
					for cell, c := range seen {
						if c != 1 {
							t.Fatalf("pixel %v pair %d, %d samples: cell %d of the %dx%d intervals holds %d points", px, pair, n, cell, nx, ny, c)
						}
					}
				}
			}
		}
	}
}

// TestSamplerPrefixOfLaterBlock checks that the samples of a pixel from 2^m
// on are a net too: any aligned block of 2^m sample indices is stratified,
// so a pass boundary at a power of two loses nothing.
func TestSamplerPrefixOfLaterBlock(t *testing.T) {
	fk := frameKey(1, 1)
	const m = 5
	n := 1 << m
	for _, start := range []int{n, 3 * n} {
		seen := make([]int, n)
		for i := start; i < start+n; i++ {
			s := newSampler(fk, 3, 4, i)
			seen[int(s.at(4)*float64(n))]++
		}
		for cell, c := range seen {
			if c != 1 {
				t.Fatalf("samples [%d,%d): interval %d holds %d points", start, start+n, cell, c)
			}
		}
	}
}

// TestSamplerPairsDecorrelated: padding gives each pair its own index
// shuffle and scramble, so two pairs of one pixel are not the same sequence
// and are not correlated beyond chance.
func TestSamplerPairsDecorrelated(t *testing.T) {
	fk := frameKey(5, 1)
	const n = 4096
	var sx, sy, sxy, sxx, syy float64
	same := 0
	for i := range n {
		s := newSampler(fk, 10, 20, i)
		x, y := s.at(0), s.at(4) // first numbers of pairs 0 and 2
		if x == y {
			same++
		}
		sx, sy, sxy, sxx, syy = sx+x, sy+y, sxy+x*y, sxx+x*x, syy+y*y
	}
	if same > 0 {
		t.Fatalf("pairs 0 and 2 gave %d equal numbers of %d", same, n)
	}
	cov := sxy/n - sx/n*sy/n
	r := cov / math.Sqrt((sxx/n-sx/n*sx/n)*(syy/n-sy/n*sy/n))
	if math.Abs(r) > 0.06 { // about 4 standard deviations of r at n=4096
		t.Fatalf("pairs 0 and 2 correlate: r = %v", r)
	}
}

// TestSobolDim1Table checks the byte tables against the 32-step definition
// of the second Sobol dimension.
func TestSobolDim1Table(t *testing.T) {
	var v [32]uint32
	m := uint32(1)
	for k := range v {
		v[k] = m << (31 - k)
		m = m<<1 ^ m
	}
	if v[0] != 0x80000000 || v[1] != 0xc0000000 || v[2] != 0xa0000000 || v[3] != 0xf0000000 {
		t.Fatalf("direction numbers %x %x %x %x", v[0], v[1], v[2], v[3])
	}
	for _, i := range []uint32{0, 1, 2, 3, 255, 256, 0x12345678, 0xdeadbeef, math.MaxUint32} {
		var want uint32
		for k := range 32 {
			if i>>k&1 != 0 {
				want ^= v[k]
			}
		}
		if got := sobolDim1(i); got != want {
			t.Errorf("sobolDim1(%#x) = %#x, want %#x", i, got, want)
		}
	}
}

// TestSamplerPairMatchesAt: pair is a faster at for two dimensions, never a
// different number.
func TestSamplerPairMatchesAt(t *testing.T) {
	for i := range 64 {
		s := newSampler(frameKey(3, 2), i, 2*i, i*7)
		for d := uint64(0); d < 40; d += 2 {
			x, y := s.pair(d)
			if x != s.at(d) || y != s.at(d+1) {
				t.Fatalf("sample %d pair(%d) = %v, %v; at gives %v, %v", i, d, x, y, s.at(d), s.at(d+1))
			}
		}
	}
}
