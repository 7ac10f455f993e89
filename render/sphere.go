package render

import "math"

// sphere is a world-space sphere.
type sphere struct {
	c     Vec
	r     float64
	mat   int32
	light int32 // index into world.lights, or -1
}

func (s *sphere) bounds() box {
	r := Vec{s.r, s.r, s.r}
	return box{s.c.Sub(r), s.c.Add(r)}
}

// intersect returns the nearest t in (0, tmax) at which r hits s, or 0.
func (s *sphere) intersect(r *ray, tmax float64) float64 {
	oc := r.O.Sub(s.c)
	b := oc.Dot(r.D)
	c := oc.Dot(oc) - s.r*s.r
	disc := b*b - c
	if disc <= 0 {
		return 0
	}
	sq := math.Sqrt(disc)
	t := -b - sq
	if t > 0 && t < tmax {
		return t
	}
	t = -b + sq
	if t > 0 && t < tmax {
		return t
	}
	return 0
}

// surface returns the hit point (re-projected onto the sphere to cut
// floating-point error) and outward unit normal for a hit at t.
func (s *sphere) surface(r *ray, t float64) (Vec, Vec) {
	n := r.at(t).Sub(s.c).Normalize()
	return s.c.Add(n.MulScalar(s.r)), n
}

// sampleLight draws a direction from p toward s uniformly in the cone s
// subtends. It returns the direction, the distance to the sphere surface
// along it and the solid-angle pdf; ok is false when p is inside s.
func (s *sphere) sampleLight(p Vec, u1, u2 float64) (wi Vec, dist, pdf float64, ok bool) {
	toC := s.c.Sub(p)
	d2 := toC.LengthSquared()
	r2 := s.r * s.r
	if d2 <= r2 {
		return Vec{}, 0, 0, false
	}
	d := math.Sqrt(d2)
	sin2Max := r2 / d2
	cosMax := math.Sqrt(max(0, 1-sin2Max))
	oneMinus := sin2Max / (1 + cosMax) // 1-cosMax without cancellation
	cosT := 1 - u1*oneMinus
	sinT := math.Sqrt(max(0, 1-cosT*cosT))
	w := toC.DivScalar(d)
	t, b := basis(w)
	sp, cp := math.Sincos(2 * math.Pi * u2)
	wi = t.MulScalar(sinT * cp).Add(b.MulScalar(sinT * sp)).Add(w.MulScalar(cosT))
	// distance along wi to the near intersection
	disc := r2 - d2*sinT*sinT
	dist = d*cosT - math.Sqrt(max(0, disc))
	return wi, dist, 1 / (2 * math.Pi * oneMinus), true
}

// lightPdf is the solid-angle pdf with which sampleLight, called at p, would
// produce a direction that hits s.
func (s *sphere) lightPdf(p Vec) float64 {
	d2 := s.c.Sub(p).LengthSquared()
	r2 := s.r * s.r
	if d2 <= r2 {
		return 0
	}
	sin2Max := r2 / d2
	cosMax := math.Sqrt(max(0, 1-sin2Max))
	return 1 / (2 * math.Pi * sin2Max / (1 + cosMax))
}

// area returns the surface area of s.
func (s *sphere) area() float64 { return 4 * math.Pi * s.r * s.r }
