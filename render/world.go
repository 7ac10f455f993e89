package render

import (
	"math"
	"slices"
	"sync"
)

// primPlane tags a hit on an (unbounded, non-BVH) plane.
const primPlane = 3

// world is the scene's geometry at one frame, in world space: primitives,
// BVH and light list. It is immutable once built and shared by every tile of
// the frame, across goroutines.
type world struct {
	spheres    []sphere
	quads      []quad
	tris       []triangle
	triNormals []triNormals
	planes     []plane
	bvh        bvh
	lights     []light
	lightCDF   []float64 // cumulative selection probabilities
	mats       []material
	bg         background
}

// light is an emissive primitive that next-event estimation samples.
type light struct {
	ref  primRef
	pSel float64 // probability of choosing this light (∝ power)
}

// background is the radiance of rays that leave the scene: a vertical
// gradient from bottom (looking straight down) to top (straight up).
type background struct {
	top, bottom Vec
}

func (b *background) radiance(d Vec) Vec {
	return b.bottom.Lerp(b.top, 0.5*(d.Y+1))
}

// hit is the closest intersection found by world.intersect.
type hit struct {
	t      float64
	ref    primRef
	b1, b2 float64 // triangle barycentrics
}

// buildWorld places every object at frame f and builds the BVH and lights.
func buildWorld(s *Scene, f int) (*world, error) {
	w := &world{mats: s.materials, bg: s.bg}
	for i := range s.objects {
		o := &s.objects[i]
		xf := o.transformAt(f)
		switch o.kind {
		case objSphere:
			w.spheres = append(w.spheres, sphere{c: xf.point(o.center), r: o.radius * xf.scale.X, mat: o.mat, light: -1})
		case objQuad:
			q, ok := newQuad(xf.point(o.corner), xf.vector(o.u), xf.vector(o.v), o.mat)
			if !ok {
				return nil, sceneErr(o.field, "quad is degenerate at frame %d", f)
			}
			w.quads = append(w.quads, q)
		case objPlane:
			n := xf.normal(o.normal)
			w.planes = append(w.planes, plane{n: n, d: n.Dot(xf.point(o.point)), mat: o.mat})
		case objMesh:
			w.addMesh(o, &xf)
		}
	}
	if len(w.tris) > refIndexMask {
		return nil, sceneErr("objects", "too many triangles")
	}
	refs := make([]primRef, 0, len(w.spheres)+len(w.quads)+len(w.tris))
	bounds := make([]box, 0, cap(refs))
	for i := range w.spheres {
		refs = append(refs, makeRef(primSphere, i))
		bounds = append(bounds, w.spheres[i].bounds())
	}
	for i := range w.quads {
		refs = append(refs, makeRef(primQuad, i))
		bounds = append(bounds, w.quads[i].bounds())
	}
	for i := range w.tris {
		refs = append(refs, makeRef(primTriangle, i))
		bounds = append(bounds, w.tris[i].bounds())
	}
	w.bvh = buildBVH(refs, bounds)
	w.collectLights()
	return w, nil
}

// addMesh transforms a mesh object's triangles into world space, dropping
// triangles that are degenerate.
func (w *world) addMesh(o *object, xf *transform) {
	m := o.mesh
	w.tris = slices.Grow(w.tris, len(m.tris))
	if o.smooth {
		w.triNormals = slices.Grow(w.triNormals, len(m.tris))
	}
	pos := make([]Vec, len(m.positions))
	for i, p := range m.positions {
		pos[i] = xf.point(p)
	}
	for _, t := range m.tris {
		tri, ok := newTriangle(pos[t.v[0]], pos[t.v[1]], pos[t.v[2]], o.mat)
		if !ok {
			continue
		}
		if o.smooth {
			var ns [3]Vec
			for k := range 3 {
				if t.n[k] >= 0 {
					ns[k] = m.normals[t.n[k]]
				} else {
					ns[k] = m.vertexNormals[t.v[k]]
				}
				ns[k] = xf.normal(ns[k])
			}
			tri.smooth = int32(len(w.triNormals))
			w.triNormals = append(w.triNormals, triNormals{ns[0], ns[1], ns[2]})
		}
		w.tris = append(w.tris, tri)
	}
}

// collectLights lists every emissive sphere, quad and triangle with a
// selection probability proportional to its emitted power. Emissive planes
// are infinite and cannot be sampled; they are found by BSDF sampling only.
func (w *world) collectLights() {
	var power []float64
	add := func(ref primRef, mat int32, area float64) int32 {
		p := w.mats[mat].emission.Luminance() * area
		if w.mats[mat].typ != matEmissive || !(p > 0) || math.IsInf(p, 0) {
			return -1
		}
		w.lights = append(w.lights, light{ref: ref})
		power = append(power, p)
		return int32(len(w.lights) - 1)
	}
	for i := range w.spheres {
		w.spheres[i].light = add(makeRef(primSphere, i), w.spheres[i].mat, w.spheres[i].area())
	}
	for i := range w.quads {
		w.quads[i].light = add(makeRef(primQuad, i), w.quads[i].mat, w.quads[i].area)
	}
	for i := range w.tris {
		w.tris[i].light = add(makeRef(primTriangle, i), w.tris[i].mat, w.tris[i].area)
	}
	total := 0.0
	for _, p := range power {
		total += p
	}
	w.lightCDF = make([]float64, len(power))
	acc := 0.0
	for i, p := range power {
		acc += p
		w.lights[i].pSel = p / total
		w.lightCDF[i] = acc / total
	}
	if n := len(w.lightCDF); n > 0 {
		w.lightCDF[n-1] = 1
	}
}

// pickLight chooses a light by power with u in [0, 1).
func (w *world) pickLight(u float64) int {
	lo, hi := 0, len(w.lightCDF)-1
	for lo < hi {
		m := (lo + hi) / 2
		if w.lightCDF[m] > u {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// intersect finds the closest hit of r, if any.
func (w *world) intersect(r *ray, h *hit) bool {
	return w.traverse(r, math.Inf(1), false, h)
}

// occluded reports whether anything blocks r before distance tmax.
func (w *world) occluded(r *ray, tmax float64) bool {
	var h hit
	return w.traverse(r, tmax, true, &h)
}

// traverse walks the planes and the BVH. With anyHit it returns at the first
// hit closer than tmax; otherwise it records the closest hit in h. The box
// test (slabMinMax) is the hottest code of the renderer.
func (w *world) traverse(r *ray, tmax float64, anyHit bool, h *hit) bool {
	found := false
	for i := range w.planes {
		if t := w.planes[i].intersect(r, tmax); t > 0 {
			if anyHit {
				return true
			}
			tmax, h.t, h.ref, found = t, t, makeRef(primPlane, i), true
		}
	}
	nodes := w.bvh.nodes
	if len(nodes) == 0 {
		return found
	}
	inv := Vec{1 / r.D.X, 1 / r.D.Y, 1 / r.D.Z}
	o := r.O
	neg := [3]bool{inv.X < 0, inv.Y < 0, inv.Z < 0}
	// An infinite inverse (a zero or subnormal direction component) can
	// make a slab distance 0·inf = NaN; only slabSwap defines what a NaN
	// means, so such rays take it. The choice is per ray, so the branch
	// is predictable.
	finite := finiteInverse(inv)
	var stack [bvhStack]int32
	sp := 0
	idx := int32(0)
	for {
		n := &nodes[idx]
		var in bool
		if finite { // slabMinMax, inlined
			lo, hi := slabAxis(0, tmax, n.lo.X, n.hi.X, o.X, inv.X)
			lo, hi = slabAxis(lo, hi, n.lo.Y, n.hi.Y, o.Y, inv.Y)
			lo, hi = slabAxis(lo, hi, n.lo.Z, n.hi.Z, o.Z, inv.Z)
			in = lo <= hi
		} else {
			in = slabSwap(n, o, inv, tmax)
		}
		if in {
			if n.count == 0 {
				if neg[n.axis] {
					stack[sp], idx = idx+1, n.index
				} else {
					stack[sp], idx = n.index, idx+1
				}
				sp++
				continue
			}
			for _, ref := range w.bvh.refs[n.index : n.index+n.count] {
				switch ref.kind() {
				case primSphere:
					if t := w.spheres[ref.index()].intersect(r, tmax); t > 0 {
						if anyHit {
							return true
						}
						tmax, h.t, h.ref, found = t, t, ref, true
					}
				case primQuad:
					if t := w.quads[ref.index()].intersect(r, tmax); t > 0 {
						if anyHit {
							return true
						}
						tmax, h.t, h.ref, found = t, t, ref, true
					}
				default:
					if t, b1, b2 := w.tris[ref.index()].intersect(r, tmax); t > 0 {
						if anyHit {
							return true
						}
						tmax, h.t, h.ref, h.b1, h.b2, found = t, t, ref, b1, b2, true
					}
				}
			}
		}
		if sp == 0 {
			return found
		}
		sp--
		idx = stack[sp]
	}
}

// surfacePoint describes the surface at a hit.
type surfacePoint struct {
	p     Vec
	ng    Vec // geometric normal, facing the incoming ray
	ns    Vec // shading normal, same hemisphere as ng
	front bool
	mat   int32
	light int32
}

// surface computes the hit point, normals and material of h on ray r.
func (w *world) surface(r *ray, h *hit) surfacePoint {
	var sp surfacePoint
	switch h.ref.kind() {
	case primSphere:
		s := &w.spheres[h.ref.index()]
		sp.p, sp.ng = s.surface(r, h.t)
		sp.ns, sp.mat, sp.light = sp.ng, s.mat, s.light
	case primQuad:
		q := &w.quads[h.ref.index()]
		sp.p, sp.ng, sp.ns, sp.mat, sp.light = r.at(h.t), q.n, q.n, q.mat, q.light
	case primTriangle:
		t := &w.tris[h.ref.index()]
		sp.p = t.v0.Add(t.e1.MulScalar(h.b1)).Add(t.e2.MulScalar(h.b2))
		sp.ng, sp.ns, sp.mat, sp.light = t.n, t.n, t.mat, t.light
		if t.smooth >= 0 {
			n := &w.triNormals[t.smooth]
			ns := n.n0.MulScalar(1 - h.b1 - h.b2).Add(n.n1.MulScalar(h.b1)).Add(n.n2.MulScalar(h.b2)).Normalize()
			if !ns.IsZero() {
				sp.ns = ns
			}
		}
	default:
		p := &w.planes[h.ref.index()]
		sp.p, sp.ng, sp.ns, sp.mat, sp.light = r.at(h.t), p.n, p.n, p.mat, -1
	}
	sp.front = true
	if sp.ng.Dot(r.D) > 0 {
		sp.ng = sp.ng.Negate()
		sp.front = false
	}
	if sp.ns.Dot(sp.ng) < 0 {
		sp.ns = sp.ns.Negate()
	}
	return sp
}

// worldCache keeps the worlds of the most recently used frames so that the
// many tiles of one frame share one BVH. A scene without animated objects has
// one world for all frames.
type worldCache struct {
	mu      sync.Mutex
	entries map[int]*worldEntry
	order   []int // keys, oldest first
}

type worldEntry struct {
	once sync.Once
	w    *world
	err  error
}

const worldCacheSize = 3

// world returns the scene's world at frame f, building it at most once.
func (s *Scene) world(f int) (*world, error) {
	k := f
	if !s.animated {
		k = 0
	}
	c := &s.cache
	c.mu.Lock()
	e, ok := c.entries[k]
	if !ok {
		if c.entries == nil {
			c.entries = make(map[int]*worldEntry)
		}
		if len(c.order) >= worldCacheSize {
			delete(c.entries, c.order[0])
			c.order = c.order[1:]
		}
		e = &worldEntry{}
		c.entries[k] = e
		c.order = append(c.order, k)
	}
	c.mu.Unlock()
	e.once.Do(func() { e.w, e.err = buildWorld(s, f) })
	return e.w, e.err
}
