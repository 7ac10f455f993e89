package render

// plane is an infinite plane. It has no finite bounds, so it lives outside
// the BVH and is tested linearly (scenes have few of them).
type plane struct {
	n   Vec // unit normal
	d   float64
	mat int32
}

// intersect returns the t in (0, tmax) at which r hits p, or 0.
func (p *plane) intersect(r *ray, tmax float64) float64 {
	den := p.n.Dot(r.D)
	if den > -1e-12 && den < 1e-12 {
		return 0
	}
	t := (p.d - p.n.Dot(r.O)) / den
	if t > 0 && t < tmax {
		return t
	}
	return 0
}
