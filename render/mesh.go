package render

import "math"

// triangle is a world-space triangle v0, v0+e1, v0+e2.
type triangle struct {
	v0, e1, e2 Vec
	n          Vec // unit geometric normal e1×e2
	area       float64
	mat        int32
	light      int32
	smooth     int32 // index into world.triNormals, or -1 for flat shading
}

// triNormals are the per-vertex shading normals of a smooth triangle.
type triNormals struct {
	n0, n1, n2 Vec
}

// newTriangle precomputes a triangle; ok is false for a degenerate one.
func newTriangle(a, b, c Vec, mat int32) (triangle, bool) {
	e1, e2 := b.Sub(a), c.Sub(a)
	cr := e1.Cross(e2)
	l := cr.Length()
	if !(l > 0) || math.IsInf(l, 0) {
		return triangle{}, false
	}
	return triangle{v0: a, e1: e1, e2: e2, n: cr.DivScalar(l), area: l / 2, mat: mat, light: -1, smooth: -1}, true
}

func (t *triangle) bounds() box {
	return emptyBox().extendPoint(t.v0).extendPoint(t.v0.Add(t.e1)).extendPoint(t.v0.Add(t.e2))
}

// intersect is Möller-Trumbore: it returns t in (0, tmax) and the
// barycentrics (b1, b2) of the hit, or t = 0.
func (t *triangle) intersect(r *ray, tmax float64) (float64, float64, float64) {
	p := r.D.Cross(t.e2)
	det := t.e1.Dot(p)
	if det > -1e-14 && det < 1e-14 {
		return 0, 0, 0
	}
	inv := 1 / det
	s := r.O.Sub(t.v0)
	u := s.Dot(p) * inv
	if u < 0 || u > 1 {
		return 0, 0, 0
	}
	q := s.Cross(t.e1)
	v := r.D.Dot(q) * inv
	if v < 0 || u+v > 1 {
		return 0, 0, 0
	}
	d := t.e2.Dot(q) * inv
	if !(d > 0 && d < tmax) {
		return 0, 0, 0
	}
	return d, u, v
}

// sampleLight picks a uniform point on t and returns the direction to it
// from p, its distance and the solid-angle pdf.
func (t *triangle) sampleLight(p Vec, u1, u2 float64) (Vec, float64, float64) {
	su := math.Sqrt(u1)
	pt := t.v0.Add(t.e1.MulScalar(su * (1 - u2))).Add(t.e2.MulScalar(su * u2))
	return areaLightDir(p, pt, t.n, t.area)
}

// meshObject is a parsed OBJ mesh in object space, shared by every frame.
type meshObject struct {
	positions     []Vec
	normals       []Vec // from vn lines
	vertexNormals []Vec // area-weighted per-position normals, for smooth shading without vn
	tris          []objTri
}

// objTri indexes the three corners of a triangle: positions and shading
// normals (-1: none).
type objTri struct {
	v [3]int32
	n [3]int32
}
