package render

import "math/bits"

// The sampler is stateless: every number is a function of (seed, frame,
// pixel x, pixel y, sample index, dimension). No goroutine, tile, clock or
// global generator can influence a pixel, which is what makes any tiling and
// any checkpoint/resume split produce identical bits.
//
// The numbers are Owen-scrambled Sobol points with hash-based scrambling and
// padding by pairs of dimensions. Each pair of dimensions (0-1, 2-3, ...) of
// a pixel takes the first two Sobol dimensions, a (0,2)-sequence, at a
// shuffled sample index, with its own scramble seeds:
//
//   - the sample index is Owen-scrambled (a nested uniform permutation in
//     base 2), which maps the first 2^m indices of a pixel onto an aligned
//     block of 2^m Sobol indices, so every power-of-two prefix of a pixel's
//     samples is still a (0,m,2)-net, and decorrelates the pairs from each
//     other (padding);
//   - each coordinate is Owen-scrambled with its own seed, which keeps the
//     net property and makes the estimate unbiased.
//
// A pixel's samples are therefore stratified in every pair (sub-pixel
// position, lens, each bounce's light and BSDF samples) and converge faster
// than independent random numbers, while staying a pure function of the
// sample index: no sample depends on another, on a pass boundary or on the
// tile it is rendered in.

const golden = 0x9e3779b97f4a7c15

// mix64 is the splitmix64 finaliser: a bijective avalanche of 64 bits.
func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	return z
}

// hashCombine folds v into the running key h.
func hashCombine(h, v uint64) uint64 { return mix64(h + golden + v) }

// frameKey hashes the parts of the random stream shared by a whole frame.
func frameKey(seed uint64, frame int) uint64 {
	return hashCombine(mix64(seed^0x5eed5eed5eed5eed), uint64(int64(frame)))
}

// sobol1 holds the second Sobol dimension's generator matrix as byte
// tables: sobol1[b][v] is the XOR of the direction numbers of the bits set
// in byte value v at byte position b of the index. It is a constant derived
// from the primitive polynomial x+1, not random state; four lookups replace
// a 32-step loop in the hot path.
var sobol1 = sobol1Tables()

// sobol1Tables computes sobol1. Direction numbers of x+1: m_0 = 1,
// m_k = 2·m_{k-1} XOR m_{k-1}, v_k = m_k << (31-k).
func sobol1Tables() (t [4][256]uint32) {
	var v [32]uint32
	m := uint32(1)
	for k := range v {
		v[k] = m << (31 - k)
		m = m<<1 ^ m
	}
	for b := range 4 {
		for x := range 256 {
			var acc uint32
			for j := range 8 {
				if x>>j&1 != 0 {
					acc ^= v[8*b+j]
				}
			}
			t[b][x] = acc
		}
	}
	return t
}

// sobolDim1 returns the second Sobol dimension of index i as a 32-bit
// fraction. (The first dimension is bits.Reverse32(i).)
func sobolDim1(i uint32) uint32 {
	return sobol1[0][i&0xff] ^ sobol1[1][i>>8&0xff] ^ sobol1[2][i>>16&0xff] ^ sobol1[3][i>>24]
}

// lkPermute is a hash-based nested uniform permutation in reversed-bit
// space (the Laine-Karras construction with Vegdahl's constants): every
// step is a bijection in which bit j depends only on bits below j, so in
// the reversed bit order it is an Owen scrambling with a seed-chosen tree
// of flips.
func lkPermute(x, seed uint32) uint32 {
	x ^= x * 0x3d20adea
	x += seed
	x *= seed>>16 | 1
	x ^= x * 0x05526c56
	x ^= x * 0x53a22864
	return x
}

// owenScramble Owen-scrambles the 32-bit fraction x with seed.
func owenScramble(x, seed uint32) uint32 {
	return bits.Reverse32(lkPermute(bits.Reverse32(x), seed))
}

// sampler yields the numbers of one sample of one pixel. Dimensions are
// laid out by the integrator (see the dimension constants there) in pairs,
// so the stream a path consumes does not depend on which branches earlier
// bounces took, and the two numbers of a 2D decision (a sub-pixel position,
// a point on a light, a BSDF direction) share one stratified pair.
type sampler struct {
	key uint64 // the pixel's key: frame key, x and y
	idx uint32 // the sample index

	// legacy, when set, replaces the Owen-scrambled Sobol numbers; only
	// tests and benchmarks set it, to compare against another sampler on
	// the same integrator. Production tiles leave it nil.
	legacy func(key uint64, idx uint32, d uint64) float64
}

// newSampler returns the sampler of sample index s of pixel (x, y). s is
// below MaxSPP, so it fits the 32-bit Sobol index.
func newSampler(fk uint64, x, y, s int) sampler {
	k := hashCombine(fk, uint64(int64(x)))
	k = hashCombine(k, uint64(int64(y)))
	return sampler{key: k, idx: uint32(s)}
}

// at returns the number of dimension d in [0, 1).
func (s *sampler) at(d uint64) float64 {
	if s.legacy != nil {
		return s.legacy(s.key, s.idx, d)
	}
	h, i := s.pairIndex(d)
	if d&1 == 0 {
		return sobolX(i, h)
	}
	return sobolY(i, h)
}

// pair returns the numbers of dimensions d and d+1 for an even d: one 2D
// point, computed with one index shuffle.
func (s *sampler) pair(d uint64) (float64, float64) {
	if s.legacy != nil {
		return s.legacy(s.key, s.idx, d), s.legacy(s.key, s.idx, d+1)
	}
	h, i := s.pairIndex(d)
	return sobolX(i, h), sobolY(i, h)
}

// pairIndex returns the seeds of the pair holding dimension d and the
// pair's shuffled Sobol index of this sample.
func (s *sampler) pairIndex(d uint64) (h uint64, i uint32) {
	h = mix64(s.key + (d>>1+1)*golden)
	return h, owenScramble(s.idx, uint32(h))
}

// sobolX is the scrambled first coordinate of Sobol point i. Dimension 0 is
// the bit reversal of i, so scrambling its reversed bits saves two reversals.
func sobolX(i uint32, h uint64) float64 {
	return float64(bits.Reverse32(lkPermute(i, uint32(h>>32)))) * (1.0 / (1 << 32))
}

// sobolY is the scrambled second coordinate of Sobol point i.
func sobolY(i uint32, h uint64) float64 {
	// The seed is another 32 bits of the well-mixed h: its product with an
	// odd constant, high half.
	return float64(owenScramble(sobolDim1(i), uint32(h*0xd6e8feb86659fd93>>32))) * (1.0 / (1 << 32))
}
