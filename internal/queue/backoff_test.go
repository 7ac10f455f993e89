package queue

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoffDoublesAndCaps(t *testing.T) {
	base, maxD := 100*time.Millisecond, 3*time.Second
	prev := time.Duration(0)
	for attempt := 1; attempt <= 10; attempt++ {
		d := Backoff(attempt, base, maxD, nil)
		if d > maxD {
			t.Fatalf("attempt %d: %v exceeds max %v", attempt, d, maxD)
		}
		if d < prev {
			t.Fatalf("attempt %d: %v shorter than previous %v", attempt, d, prev)
		}
		if want := base << (attempt - 1); want < maxD && d != want {
			t.Fatalf("attempt %d: %v, want base doubled to %v", attempt, d, want)
		}
		prev = d
	}
	if got := Backoff(10, base, maxD, nil); got != maxD {
		t.Fatalf("attempt 10: %v, want the cap %v", got, maxD)
	}
	if got := Backoff(1000, time.Second, time.Hour, nil); got != time.Hour {
		t.Fatalf("huge attempt: %v, want cap without overflow", got)
	}
	if got := Backoff(0, base, maxD, nil); got != base {
		t.Fatalf("attempt 0: %v, want base", got)
	}
	if got := Backoff(1, 0, maxD, nil); got != 0 {
		t.Fatalf("zero base: %v, want 0", got)
	}
}

func TestBackoffJitterStaysInHalfOpenRange(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base, maxD := 50*time.Millisecond, 2*time.Second
	sources := map[string]func() float64{
		"pcg":        rng.Float64,
		"crypto":     CryptoJitter,
		"zero":       func() float64 { return 0 },
		"one":        func() float64 { return 1 },
		"above one":  func() float64 { return 7 },
		"negative":   func() float64 { return -3 },
		"nan":        func() float64 { return math.NaN() },
		"almost one": func() float64 { return math.Nextafter(1, 0) },
	}
	for name, j := range sources {
		for attempt := 1; attempt <= 8; attempt++ {
			full := Backoff(attempt, base, maxD, nil)
			for range 50 {
				d := Backoff(attempt, base, maxD, j)
				if d < full/2 || d > full {
					t.Fatalf("%s attempt %d: %v outside [%v, %v]", name, attempt, d, full/2, full)
				}
			}
		}
	}
	// A real jitter source must actually spread the delays.
	seen := map[time.Duration]bool{}
	for range 100 {
		seen[Backoff(5, base, maxD, rng.Float64)] = true
	}
	if len(seen) < 50 {
		t.Fatalf("jittered backoff produced only %d distinct delays in 100 draws", len(seen))
	}
}

func TestCryptoJitterRange(t *testing.T) {
	sum := 0.0
	for range 1000 {
		j := CryptoJitter()
		if j < 0 || j >= 1 {
			t.Fatalf("CryptoJitter() = %v, want [0,1)", j)
		}
		sum += j
	}
	if mean := sum / 1000; mean < 0.4 || mean > 0.6 {
		t.Fatalf("mean of 1000 draws = %v, want about 0.5", mean)
	}
}
