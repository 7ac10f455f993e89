package checkpoint

import "math"

// shuffleFloat64s writes the little-endian float64 bits of src into dst as
// eight byte planes: byte 0 of every value, then byte 1 of every value, ...,
// then byte 7 (the blosc "shuffle" filter). The sign, exponent and high
// mantissa bytes of accumulated pixel sums change slowly from one value to
// the next, so grouping them gives zstd long runs it can compress, which the
// interleaved raw layout, dominated by noisy low mantissa bytes, does not.
// The transform is a pure byte permutation, so it keeps every bit (NaN
// payloads, -0, infinities, subnormals). dst must hold exactly 8*len(src)
// bytes.
func shuffleFloat64s(dst []byte, src []float64) {
	n := len(src)
	dst = dst[:8*n]
	p0, p1, p2, p3 := dst[0*n:1*n], dst[1*n:2*n], dst[2*n:3*n], dst[3*n:4*n]
	p4, p5, p6, p7 := dst[4*n:5*n], dst[5*n:6*n], dst[6*n:7*n], dst[7*n:8*n]
	for i, v := range src {
		b := math.Float64bits(v)
		p0[i] = byte(b)
		p1[i] = byte(b >> 8)
		p2[i] = byte(b >> 16)
		p3[i] = byte(b >> 24)
		p4[i] = byte(b >> 32)
		p5[i] = byte(b >> 40)
		p6[i] = byte(b >> 48)
		p7[i] = byte(b >> 56)
	}
}

// unshuffleFloat64s is the inverse of shuffleFloat64s: it reassembles dst
// from the eight byte planes in src, which must hold exactly 8*len(dst)
// bytes.
func unshuffleFloat64s(dst []float64, src []byte) {
	n := len(dst)
	src = src[:8*n]
	p0, p1, p2, p3 := src[0*n:1*n], src[1*n:2*n], src[2*n:3*n], src[3*n:4*n]
	p4, p5, p6, p7 := src[4*n:5*n], src[5*n:6*n], src[6*n:7*n], src[7*n:8*n]
	for i := range dst {
		b := uint64(p0[i]) | uint64(p1[i])<<8 | uint64(p2[i])<<16 | uint64(p3[i])<<24 |
			uint64(p4[i])<<32 | uint64(p5[i])<<40 | uint64(p6[i])<<48 | uint64(p7[i])<<56
		dst[i] = math.Float64frombits(b)
	}
}
