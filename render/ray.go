package render

// ray is a half-line with a unit direction.
type ray struct {
	O, D Vec
}

// at returns the point at distance t along r.
func (r ray) at(t float64) Vec { return r.O.Add(r.D.MulScalar(t)) }

// spawnOffset returns p pushed off a surface along the unit normal n, toward
// the side that direction d leaves into, so a new ray does not re-hit the
// surface it starts on. The offset scales with the magnitude of p because the
// floating-point error of a hit point does.
func spawnOffset(p, n, d Vec) Vec {
	eps := 1e-7 * (1 + p.MaxAbs())
	if d.Dot(n) < 0 {
		eps = -eps
	}
	return p.Add(n.MulScalar(eps))
}
