package checkpoint

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func TestShuffleGoldenLayout(t *testing.T) {
	src := []float64{
		math.Float64frombits(0x8877665544332211),
		math.Float64frombits(0x0f0e0d0c0b0a0908),
		math.Float64frombits(0xfff8dead0000beef),
	}
	want := []byte{
		0x11, 0x08, 0xef, // byte 0 (least significant) of each value
		0x22, 0x09, 0xbe,
		0x33, 0x0a, 0x00,
		0x44, 0x0b, 0x00,
		0x55, 0x0c, 0xad,
		0x66, 0x0d, 0xde,
		0x77, 0x0e, 0xf8,
		0x88, 0x0f, 0xff, // byte 7: sign and high exponent bits
	}
	got := make([]byte, 8*len(src))
	shuffleFloat64s(got, src)
	if !bytes.Equal(got, want) {
		t.Fatalf("shuffled = % x\nwant       % x", got, want)
	}
	back := make([]float64, len(src))
	unshuffleFloat64s(back, want)
	for i := range src {
		if math.Float64bits(back[i]) != math.Float64bits(src[i]) {
			t.Fatalf("unshuffled[%d] = %016x, want %016x", i, math.Float64bits(back[i]), math.Float64bits(src[i]))
		}
	}
}

func TestShuffleRoundTripBitExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 9))
	for _, n := range []int{0, 1, 2, 3, 7, 8, 9, len(specialFloats), 1000, 64 * 64 * 3} {
		src := make([]float64, n)
		for i := range src {
			if i < len(specialFloats) && n != 1000 {
				src[i] = specialFloats[i]
			} else {
				// Arbitrary bit patterns, including NaNs with any payload.
				src[i] = math.Float64frombits(rng.Uint64())
			}
		}
		shuffled := make([]byte, 8*n)
		shuffleFloat64s(shuffled, src)
		if want := v2Bytes(src); !bytes.Equal(shuffled, want) {
			t.Fatalf("n=%d: shuffle differs from the documented layout", n)
		}
		back := make([]float64, n)
		unshuffleFloat64s(back, shuffled)
		for i := range src {
			if math.Float64bits(back[i]) != math.Float64bits(src[i]) {
				t.Fatalf("n=%d: value %d came back as %016x, want %016x", n, i, math.Float64bits(back[i]), math.Float64bits(src[i]))
			}
		}
	}
}

func FuzzShuffleRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add(v1Bytes(specialFloats))
	f.Fuzz(func(t *testing.T, b []byte) {
		src := make([]float64, len(b)/8)
		for i := range src {
			src[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
		shuffled := make([]byte, 8*len(src))
		shuffleFloat64s(shuffled, src)
		back := make([]float64, len(src))
		unshuffleFloat64s(back, shuffled)
		if got := v1Bytes(back); !bytes.Equal(got, b[:8*len(src)]) {
			t.Fatalf("round trip changed bits: % x -> % x", b[:8*len(src)], got)
		}
	})
}
