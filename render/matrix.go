package render

import "math"

// transform is an affine object-to-world mapping: scale, then rotate about X,
// Y and Z (in that order), then translate. Keeping it in this factored form
// makes normal transformation (R·S⁻¹·n) exact without a general inverse.
type transform struct {
	scale     Vec
	rot       [3]Vec // rows of the rotation matrix
	translate Vec
}

// identityTransform leaves points unchanged.
func identityTransform() transform {
	return newTransform(Vec{}, Vec{}, Vec{1, 1, 1})
}

// newTransform builds a transform from a translation, XYZ Euler rotation in
// degrees and per-axis scale.
func newTransform(translate, rotateDeg, scale Vec) transform {
	rx := rotateDeg.X * math.Pi / 180
	ry := rotateDeg.Y * math.Pi / 180
	rz := rotateDeg.Z * math.Pi / 180
	sx, cx := math.Sincos(rx)
	sy, cy := math.Sincos(ry)
	sz, cz := math.Sincos(rz)
	// R = Rz · Ry · Rx
	r := [3]Vec{
		{cz * cy, cz*sy*sx - sz*cx, cz*sy*cx + sz*sx},
		{sz * cy, sz*sy*sx + cz*cx, sz*sy*cx - cz*sx},
		{-sy, cy * sx, cy * cx},
	}
	return transform{scale: scale, rot: r, translate: translate}
}

// rotate applies the rotation part.
func (t *transform) rotate(v Vec) Vec {
	return Vec{t.rot[0].Dot(v), t.rot[1].Dot(v), t.rot[2].Dot(v)}
}

// point maps a position.
func (t *transform) point(p Vec) Vec { return t.rotate(p.Mul(t.scale)).Add(t.translate) }

// vector maps a direction or edge (no translation).
func (t *transform) vector(v Vec) Vec { return t.rotate(v.Mul(t.scale)) }

// normal maps a surface normal (inverse transpose) and renormalises it.
func (t *transform) normal(n Vec) Vec { return t.rotate(n.Div(t.scale)).Normalize() }

// uniformScale reports whether all scale components are equal.
func (t *transform) uniformScale() bool {
	return t.scale.X == t.scale.Y && t.scale.Y == t.scale.Z
}
