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
