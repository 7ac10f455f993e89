package raster

import (
	"bytes"
	"math"
	"testing"
)

// FuzzDecodeTile: DecodeTile never panics and accepts exactly the buffers of 4*n bytes; what it
// accepts holds n values and encodes back to the very bytes it came from (tile objects are
// stored bit-exact, NaN payloads included).
//
// n is fuzzed over every int: DecodeTile allocates only once len(b) == 4*n, so the buffer
// bounds the allocation and the extremes (negative, MaxInt/4 and above) are safe to try. The
// exact length len(b)/4 is checked as well, so the accepting path is exercised on every input
// whose length is a multiple of 4, not only when the mutator happens to hit it.
func FuzzDecodeTile(f *testing.F) {
	f.Add([]byte{}, 0)
	f.Add([]byte{}, 1)
	f.Add([]byte{0, 0, 0x80, 0x3f}, 1)                         // 1.0
	f.Add([]byte{0x45, 0x23, 0xc1, 0x7f, 0, 0, 0x80, 0xff}, 2) // a NaN with a payload, -Inf
	f.Add([]byte{1, 2, 3}, 1)
	f.Add(EncodeTile([]float32{0.18, -1, float32(math.Inf(1)), 1e30, float32(math.Copysign(0, -1)),
		math.Float32frombits(0x7fa00001)}), 6)
	f.Add(EncodeTile(testFrame(5, 3, 2).Pix), 45)
	f.Add([]byte{0, 0, 0, 0}, -1)
	f.Add([]byte{0, 0, 0, 0}, math.MaxInt/4)
	f.Add([]byte{0, 0, 0, 0}, math.MaxInt/4+1)
	f.Add([]byte{0, 0, 0, 0}, math.MinInt)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		checkDecodeTile(t, b, n)
		if len(b)%4 == 0 {
			checkDecodeTile(t, b, len(b)/4)
		}
	})
}

func checkDecodeTile(t *testing.T, b []byte, n int) {
	t.Helper()
	pix, err := DecodeTile(b, n)
	want := n >= 0 && len(b)%4 == 0 && len(b)/4 == n
	if (err == nil) != want {
		t.Fatalf("DecodeTile(%d bytes, %d) = %v; want success %v", len(b), n, err, want)
	}
	if err != nil {
		if pix != nil {
			t.Fatalf("DecodeTile(%d bytes, %d) failed but returned %d values", len(b), n, len(pix))
		}
		return
	}
	if len(pix) != n {
		t.Fatalf("DecodeTile(%d bytes, %d) returned %d values", len(b), n, len(pix))
	}
	if again := EncodeTile(pix); !bytes.Equal(again, b) {
		t.Fatalf("EncodeTile(DecodeTile(b)) differs from b:\n got %x\nwant %x", again, b)
	}
}
