package render

import "math"

// box is an axis-aligned bounding box.
type box struct {
	lo, hi Vec
}

// emptyBox returns a box that any extend makes valid.
func emptyBox() box {
	inf := math.Inf(1)
	return box{Vec{inf, inf, inf}, Vec{-inf, -inf, -inf}}
}

// extend grows b to contain o.
func (b box) extend(o box) box { return box{b.lo.Min(o.lo), b.hi.Max(o.hi)} }

// extendPoint grows b to contain p.
func (b box) extendPoint(p Vec) box { return box{b.lo.Min(p), b.hi.Max(p)} }

// area returns the surface area of b (0 for an empty box).
func (b box) area() float64 {
	d := b.hi.Sub(b.lo)
	if d.X < 0 || d.Y < 0 || d.Z < 0 {
		return 0
	}
	return 2 * (d.X*d.Y + d.Y*d.Z + d.Z*d.X)
}

// center returns the midpoint of b.
func (b box) center() Vec { return b.lo.Add(b.hi).MulScalar(0.5) }

// slabMinMax reports whether the ray from o with inverse direction inv
// meets n's box within [0, tmax], by slabs, with min and max in place of
// compare-and-swap branches: which of a slab's two distances is nearer
// depends on the data, so those branches mispredict, and min/max do not
// branch at all. It requires every component of inv to be finite (o and
// the box are finite in any scene): then no distance is NaN, and the
// result is exactly slabSwap's, because both only compare the same
// products and the sign of a zero never decides a comparison.
//
// traverse spells it out with the same three slabAxis calls, because a
// function of this size is not inlined.
func slabMinMax(n *bvhNode, o, inv Vec, tmax float64) bool {
	lo, hi := slabAxis(0, tmax, n.lo.X, n.hi.X, o.X, inv.X)
	lo, hi = slabAxis(lo, hi, n.lo.Y, n.hi.Y, o.Y, inv.Y)
	lo, hi = slabAxis(lo, hi, n.lo.Z, n.hi.Z, o.Z, inv.Z)
	return lo <= hi
}

// slabAxis narrows the interval [lo, hi] to the slab [l, h] of one axis
// for a ray with origin o and finite inverse direction inv on that axis.
func slabAxis(lo, hi, l, h, o, inv float64) (float64, float64) {
	t0, t1 := (l-o)*inv, (h-o)*inv
	return max(lo, min(t0, t1)), min(hi, max(t0, t1))
}

// slabSwap is the slab test with compare-and-swap branches, for rays with
// an infinite component of inv (axis-parallel, or a subnormal direction
// component). On such an axis a distance is 0·inf = NaN when o lies on one
// of the box's planes. A NaN fails every comparison, so it is never
// swapped and imposes no bound itself; the other plane's distance (±inf)
// then bounds the side it would bound unswapped. The effect is: a NaN
// distance to the low plane counts as -inf and one to the high plane as
// +inf, so a ray running inside a face plane with a positive (+0) direction
// component meets the box, and one with a negative (-0) component misses it.
// This is the renderer's behaviour since pt-1; keeping it keeps every pixel.
func slabSwap(n *bvhNode, o, inv Vec, tmax float64) bool {
	lo, hi := 0.0, tmax
	t0, t1 := (n.lo.X-o.X)*inv.X, (n.hi.X-o.X)*inv.X
	if t0 > t1 {
		t0, t1 = t1, t0
	}
	if t0 > lo {
		lo = t0
	}
	if t1 < hi {
		hi = t1
	}
	t0, t1 = (n.lo.Y-o.Y)*inv.Y, (n.hi.Y-o.Y)*inv.Y
	if t0 > t1 {
		t0, t1 = t1, t0
	}
	if t0 > lo {
		lo = t0
	}
	if t1 < hi {
		hi = t1
	}
	t0, t1 = (n.lo.Z-o.Z)*inv.Z, (n.hi.Z-o.Z)*inv.Z
	if t0 > t1 {
		t0, t1 = t1, t0
	}
	if t0 > lo {
		lo = t0
	}
	if t1 < hi {
		hi = t1
	}
	return lo <= hi
}

// finiteInverse reports whether every component of the inverse direction
// inv is finite, the condition under which slabMinMax may be used.
func finiteInverse(inv Vec) bool {
	return math.Abs(inv.X) <= math.MaxFloat64 && math.Abs(inv.Y) <= math.MaxFloat64 && math.Abs(inv.Z) <= math.MaxFloat64
}
