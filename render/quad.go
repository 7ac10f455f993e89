package render

// quad is a world-space parallelogram corner + a·u + b·v, a, b in [0, 1].
type quad struct {
	corner, u, v Vec
	n            Vec     // unit normal u×v/|u×v|
	w            Vec     // (u×v)/|u×v|², for planar coordinates
	d            float64 // plane offset n·corner
	area         float64
	mat          int32
	light        int32
}

// newQuad precomputes the intersection constants; ok is false if degenerate.
func newQuad(corner, u, v Vec, mat int32) (quad, bool) {
	c := u.Cross(v)
	l2 := c.LengthSquared()
	if !(l2 > 0) || !c.Finite() {
		return quad{}, false
	}
	n := c.Normalize()
	return quad{
		corner: corner, u: u, v: v,
		n: n, w: c.DivScalar(l2), d: n.Dot(corner),
		area: c.Length(), mat: mat, light: -1,
	}, true
}

func (q *quad) bounds() box {
	b := emptyBox().extendPoint(q.corner).extendPoint(q.corner.Add(q.u)).
		extendPoint(q.corner.Add(q.v)).extendPoint(q.corner.Add(q.u).Add(q.v))
	return b
}

// intersect returns the t in (0, tmax) at which r hits q, or 0.
func (q *quad) intersect(r *ray, tmax float64) float64 {
	den := q.n.Dot(r.D)
	if den > -1e-12 && den < 1e-12 {
		return 0
	}
	t := (q.d - q.n.Dot(r.O)) / den
	if !(t > 0 && t < tmax) {
		return 0
	}
	h := r.at(t).Sub(q.corner)
	a := q.w.Dot(h.Cross(q.v))
	if a < 0 || a > 1 {
		return 0
	}
	b := q.w.Dot(q.u.Cross(h))
	if b < 0 || b > 1 {
		return 0
	}
	return t
}

// sampleLight picks a uniform point on q and returns the direction to it
// from p, its distance and the solid-angle pdf (0 if seen edge-on).
func (q *quad) sampleLight(p Vec, u1, u2 float64) (Vec, float64, float64) {
	pt := q.corner.Add(q.u.MulScalar(u1)).Add(q.v.MulScalar(u2))
	return areaLightDir(p, pt, q.n, q.area)
}

// lightPdf is the solid-angle pdf of sampleLight producing a hit on q at
// distance t along unit direction d.
func (q *quad) lightPdf(d Vec, t float64) float64 {
	return areaPdf(d, t, q.n, q.area)
}

// areaLightDir converts a uniformly chosen point pt on an area light with
// unit normal n and area A into a direction, distance and solid-angle pdf.
func areaLightDir(p, pt, n Vec, area float64) (Vec, float64, float64) {
	d := pt.Sub(p)
	dist2 := d.LengthSquared()
	if dist2 == 0 {
		return Vec{}, 0, 0
	}
	dist := sqrt(dist2)
	wi := d.DivScalar(dist)
	return wi, dist, areaPdf(wi, dist, n, area)
}

// areaPdf converts the area pdf 1/A into solid angle: dist²/(|cos|·A).
func areaPdf(wi Vec, dist float64, n Vec, area float64) float64 {
	cos := wi.Dot(n)
	if cos < 0 {
		cos = -cos
	}
	if cos < 1e-9 {
		return 0
	}
	return dist * dist / (cos * area)
}
