package queue

import (
	crand "crypto/rand"
	"encoding/binary"
	"math"
	"time"
)

// Backoff returns the NakWithDelay delay for the attempt-th failure (1-based): base doubled per attempt,
// capped at max, then "equal jitter" — a uniform pick in [d/2, d] — so retries of many tiles failing together
// spread out while each still waits at least half its step. jitter must return values in [0, 1); it is
// injected so hot paths hold no global random state and tests are deterministic. A nil jitter means none.
func Backoff(attempt int, base, max time.Duration, jitter func() float64) time.Duration {
	if base <= 0 || max <= 0 {
		return 0
	}
	if base > max {
		base = max
	}
	if attempt < 1 {
		attempt = 1
	}
	d := base
	for i := 1; i < attempt && d < max; i++ {
		if d > max/2 { // doubling would pass max (and could overflow)
			d = max
			break
		}
		d *= 2
	}
	d = min(d, max)
	if jitter == nil {
		return d
	}
	j := jitter()
	if math.IsNaN(j) || j < 0 {
		j = 0
	}
	if j >= 1 {
		j = math.Nextafter(1, 0)
	}
	half := d / 2
	return half + time.Duration(j*float64(d-half))
}

// CryptoJitter is a jitter source for Backoff that is safe for concurrent use and needs no seeding: each
// call reads 53 fresh bits from crypto/rand.
func CryptoJitter() float64 {
	var b [8]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails since Go 1.24; it crashes the program instead
	return float64(binary.LittleEndian.Uint64(b[:])>>11) / (1 << 53)
}
