package render

import (
	"fmt"
	"math"
)

// camera is a parsed camera with its animation tracks. Scalar properties are
// stored in the X component of their track values.
type camera struct {
	name          string
	position      Vec
	lookAt        Vec
	up            Vec
	fov           float64 // vertical, degrees
	aperture      float64 // lens diameter, scene units
	focusDistance float64 // 0 = distance to look_at
	easing        easing

	posTrack, lookTrack, upTrack  track
	fovTrack, apTrack, focusTrack track
}

// camFrame is a camera evaluated at one frame, ready to generate rays.
type camFrame struct {
	origin     Vec
	u, v, w    Vec // right, up, backward (the camera looks along -w)
	tanHalf    float64
	lensRadius float64
	focus      float64
}

// at evaluates the camera at frame f.
func (c *camera) at(f int) (camFrame, error) {
	pos := c.posTrack.eval(f, c.easing, c.position)
	look := c.lookTrack.eval(f, c.easing, c.lookAt)
	up := c.upTrack.eval(f, c.easing, c.up)
	fov := c.fovTrack.eval(f, c.easing, Vec{X: c.fov}).X
	ap := c.apTrack.eval(f, c.easing, Vec{X: c.aperture}).X
	focus := c.focusTrack.eval(f, c.easing, Vec{X: c.focusDistance}).X

	view := pos.Sub(look)
	if view.Length() < 1e-12 {
		return camFrame{}, fmt.Errorf("position equals look_at at frame %d", f)
	}
	w := view.Normalize()
	u := up.Cross(w)
	if u.Length() < 1e-9*up.Length() || up.IsZero() {
		return camFrame{}, fmt.Errorf("up is parallel to the view direction at frame %d", f)
	}
	u = u.Normalize()
	v := w.Cross(u)
	if focus <= 0 {
		focus = view.Length()
	}
	return camFrame{
		origin:     pos,
		u:          u,
		v:          v,
		w:          w,
		tanHalf:    math.Tan(fov * math.Pi / 360),
		lensRadius: ap / 2,
		focus:      focus,
	}, nil
}

// generate returns the primary ray through image position (sx, sy) in pixels
// (y=0 is the top edge) for an image of width×height, with lens sample
// (l1, l2) for depth of field.
func (c *camFrame) generate(sx, sy, width, height, l1, l2 float64) ray {
	aspect := width / height
	px := (2*sx/width - 1) * c.tanHalf * aspect
	py := (1 - 2*sy/height) * c.tanHalf
	d := c.u.MulScalar(px).Add(c.v.MulScalar(py)).Sub(c.w)
	if c.lensRadius <= 0 {
		return ray{O: c.origin, D: d.Normalize()}
	}
	focusPt := c.origin.Add(d.MulScalar(c.focus))
	lx, ly := concentricDisk(l1, l2)
	o := c.origin.Add(c.u.MulScalar(lx * c.lensRadius)).Add(c.v.MulScalar(ly * c.lensRadius))
	return ray{O: o, D: focusPt.Sub(o).Normalize()}
}

// concentricDisk maps the unit square onto the unit disk (Shirley-Chiu),
// preserving stratification.
func concentricDisk(u1, u2 float64) (float64, float64) {
	a := 2*u1 - 1
	b := 2*u2 - 1
	if a == 0 && b == 0 {
		return 0, 0
	}
	var r, phi float64
	if math.Abs(a) > math.Abs(b) {
		r = a
		phi = math.Pi / 4 * (b / a)
	} else {
		r = b
		phi = math.Pi/2 - math.Pi/4*(a/b)
	}
	s, c := math.Sincos(phi)
	return r * c, r * s
}
