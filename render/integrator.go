package render

// The integrator is a unidirectional path tracer with next-event estimation
// toward emissive spheres, quads and triangles, combined with BSDF sampling by
// multiple importance sampling (power heuristic), and Russian roulette after
// a few bounces. All randomness comes from the sampler with a fixed
// dimension layout per bounce.

// The dimension layout: the sampler stratifies aligned pairs of dimensions
// (0-1, 2-3, ...), so each 2D decision takes one pair and 1D decisions share
// the remaining pairs.
const (
	dimPixel   = 0 // pair: sub-pixel position
	dimLens    = 2 // pair: lens position
	dimBounce0 = 4 // first bounce's block
	dimPerHop  = 8 // dims per bounce: the offsets below; 6 and 7 are spare

	hopLight    = 0 // pair: point on the light picked for next-event estimation
	hopBSDF     = 2 // pair: BSDF direction
	hopPick     = 4 // light pick
	hopRoulette = 5 // Russian roulette

	rouletteStart = 3 // bounces before Russian roulette may end a path
)

// radiance traces one camera path and returns its radiance estimate. rays
// counts the rays cast (for throughput metrics).
func (w *world) radiance(r ray, s *sampler, maxDepth int, rays *uint64) Vec {
	var l Vec
	beta := Vec{1, 1, 1}
	specular := true // camera rays and delta bounces take emission with full weight
	prevPdf := 0.0
	var prevP Vec
	var h hit
	for bounce := 0; ; bounce++ {
		*rays++
		if !w.intersect(&r, &h) {
			l = l.Add(beta.Mul(w.bg.radiance(r.D)))
			break
		}
		sp := w.surface(&r, &h)
		m := &w.mats[sp.mat]
		if m.typ == matEmissive {
			le := m.emission
			if !sp.front && h.ref.kind() == primSphere {
				le = Vec{} // spheres emit outward only; quads and triangles on both sides
			}
			if !le.IsZero() {
				wgt := 1.0
				if !specular && sp.light >= 0 {
					pl := w.lights[sp.light].pSel * w.lightPdfAt(h.ref, prevP, r.D, h.t)
					wgt = powerHeuristic(prevPdf, pl)
				}
				l = l.Add(beta.Mul(le).MulScalar(wgt))
			}
			break // emitters do not scatter
		}
		if bounce >= maxDepth {
			break
		}
		// Numbers are drawn only where a decision needs them: each is a pure
		// function of its dimension, so skipping one changes no other.
		d := dimBounce0 + uint64(bounce)*dimPerHop
		wo := r.D.Negate()

		if !m.specular() && len(w.lights) > 0 {
			uL1, uL2 := s.pair(d + hopLight)
			l = l.Add(beta.Mul(w.directLight(m, &sp, wo, s.at(d+hopPick), uL1, uL2, rays)))
		}

		uB1, uB2 := s.pair(d + hopBSDF)
		bs := m.sample(wo, sp.ns, sp.ng, sp.front, uB1, uB2)
		if !bs.ok {
			break
		}
		beta = beta.Mul(bs.weight)
		specular = bs.specular
		prevPdf = bs.pdf
		prevP = sp.p
		r = ray{O: spawnOffset(sp.p, sp.ng, bs.wi), D: bs.wi}

		if bounce+1 >= rouletteStart {
			q := max(0.05, 1-beta.MaxComponent())
			if s.at(d+hopRoulette) < q {
				break
			}
			beta = beta.MulScalar(1 / (1 - q))
		}
		if beta.IsZero() {
			break
		}
	}
	return l
}

// directLight samples one light by power and returns its MIS-weighted
// contribution f·Le·cos/pdf at sp.
func (w *world) directLight(m *material, sp *surfacePoint, wo Vec, uPick, u1, u2 float64, rays *uint64) Vec {
	li := w.pickLight(uPick)
	lt := &w.lights[li]
	var wi Vec
	var dist, pdf float64
	var le Vec
	switch lt.ref.kind() {
	case primSphere:
		s := &w.spheres[lt.ref.index()]
		var ok bool
		wi, dist, pdf, ok = s.sampleLight(sp.p, u1, u2)
		if !ok {
			return Vec{}
		}
		le = w.mats[s.mat].emission
	case primQuad:
		q := &w.quads[lt.ref.index()]
		wi, dist, pdf = q.sampleLight(sp.p, u1, u2)
		le = w.mats[q.mat].emission
	default:
		t := &w.tris[lt.ref.index()]
		wi, dist, pdf = t.sampleLight(sp.p, u1, u2)
		le = w.mats[t.mat].emission
	}
	if !(pdf > 0) || dist <= 0 {
		return Vec{}
	}
	f, bsdfPdf := m.eval(wo, wi, sp.ns, sp.ng)
	if f.IsZero() {
		return Vec{}
	}
	*rays++
	shadow := ray{O: spawnOffset(sp.p, sp.ng, wi), D: wi}
	if w.occluded(&shadow, dist*(1-1e-6)) {
		return Vec{}
	}
	pl := lt.pSel * pdf
	return f.Mul(le).MulScalar(powerHeuristic(pl, bsdfPdf) / pl)
}

// lightPdfAt is the solid-angle pdf with which directLight, called at p,
// samples the point hit at distance t along d on light primitive ref (not
// including the selection probability).
func (w *world) lightPdfAt(ref primRef, p, d Vec, t float64) float64 {
	switch ref.kind() {
	case primSphere:
		return w.spheres[ref.index()].lightPdf(p)
	case primQuad:
		return w.quads[ref.index()].lightPdf(d, t)
	case primTriangle:
		tr := &w.tris[ref.index()]
		return areaPdf(d, t, tr.n, tr.area)
	}
	return 0
}

// powerHeuristic is the MIS weight of a strategy with pdf a against one
// with pdf b.
func powerHeuristic(a, b float64) float64 {
	a2 := a * a
	d := a2 + b*b
	if d == 0 {
		return 0
	}
	return a2 / d
}
