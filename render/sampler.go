package render

// The sampler is stateless: every random number is a hash of (seed, frame,
// pixel x, pixel y, sample index, dimension). No goroutine, tile, clock or
// global generator can influence a pixel, which is what makes any tiling and
// any checkpoint/resume split produce identical bits.

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

// sampler yields the random numbers of one sample of one pixel. Dimensions are
// laid out by the integrator (see dimension constants there), so the stream a
// path consumes does not depend on which branches earlier bounces took.
type sampler struct {
	key uint64
	dim uint64
}

// newSampler returns the sampler of sample index s of pixel (x, y).
func newSampler(fk uint64, x, y, s int) sampler {
	k := hashCombine(fk, uint64(int64(x)))
	k = hashCombine(k, uint64(int64(y)))
	k = hashCombine(k, uint64(int64(s)))
	return sampler{key: k}
}

// at returns the number of dimension d in [0, 1).
func (s *sampler) at(d uint64) float64 {
	return float64(mix64(s.key+d*golden)>>11) * (1.0 / (1 << 53))
}

// setDim makes the next call to next return dimension d.
func (s *sampler) setDim(d uint64) { s.dim = d }

// next returns the next dimension's number in [0, 1).
func (s *sampler) next() float64 {
	v := s.at(s.dim)
	s.dim++
	return v
}
