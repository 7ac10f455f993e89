package render

import "math"

// Vec is a 3-component vector of float64 used for points, directions and
// linear RGB colours. It is a value type: every method returns a new Vec, so
// the hot loops never allocate.
type Vec struct {
	X, Y, Z float64
}

// Add returns a+b.
func (a Vec) Add(b Vec) Vec { return Vec{a.X + b.X, a.Y + b.Y, a.Z + b.Z} }

// Sub returns a-b.
func (a Vec) Sub(b Vec) Vec { return Vec{a.X - b.X, a.Y - b.Y, a.Z - b.Z} }

// Mul returns the component-wise product of a and b.
func (a Vec) Mul(b Vec) Vec { return Vec{a.X * b.X, a.Y * b.Y, a.Z * b.Z} }

// Div returns the component-wise quotient of a and b.
func (a Vec) Div(b Vec) Vec { return Vec{a.X / b.X, a.Y / b.Y, a.Z / b.Z} }

// MulScalar returns a*s.
func (a Vec) MulScalar(s float64) Vec { return Vec{a.X * s, a.Y * s, a.Z * s} }

// DivScalar returns a/s.
func (a Vec) DivScalar(s float64) Vec { return Vec{a.X / s, a.Y / s, a.Z / s} }

// Negate returns -a.
func (a Vec) Negate() Vec { return Vec{-a.X, -a.Y, -a.Z} }

// Dot returns the dot product of a and b.
func (a Vec) Dot(b Vec) float64 { return a.X*b.X + a.Y*b.Y + a.Z*b.Z }

// Cross returns the cross product a×b.
func (a Vec) Cross(b Vec) Vec {
	return Vec{a.Y*b.Z - a.Z*b.Y, a.Z*b.X - a.X*b.Z, a.X*b.Y - a.Y*b.X}
}

// Length returns the Euclidean length of a.
func (a Vec) Length() float64 { return math.Sqrt(a.X*a.X + a.Y*a.Y + a.Z*a.Z) }

// LengthSquared returns the squared length of a.
func (a Vec) LengthSquared() float64 { return a.X*a.X + a.Y*a.Y + a.Z*a.Z }

// Normalize returns a scaled to unit length (a zero vector stays zero).
func (a Vec) Normalize() Vec {
	l := a.Length()
	if l == 0 {
		return a
	}
	return a.MulScalar(1 / l)
}

// Min returns the component-wise minimum of a and b.
func (a Vec) Min(b Vec) Vec { return Vec{min(a.X, b.X), min(a.Y, b.Y), min(a.Z, b.Z)} }

// Max returns the component-wise maximum of a and b.
func (a Vec) Max(b Vec) Vec { return Vec{max(a.X, b.X), max(a.Y, b.Y), max(a.Z, b.Z)} }

// MaxComponent returns the largest component of a.
func (a Vec) MaxComponent() float64 { return max(a.X, a.Y, a.Z) }

// MaxAbs returns the largest absolute component of a.
func (a Vec) MaxAbs() float64 { return max(math.Abs(a.X), math.Abs(a.Y), math.Abs(a.Z)) }

// Axis returns component i (0=X, 1=Y, 2=Z).
func (a Vec) Axis(i int) float64 {
	switch i {
	case 0:
		return a.X
	case 1:
		return a.Y
	}
	return a.Z
}

// Lerp returns a + (b-a)*t.
func (a Vec) Lerp(b Vec, t float64) Vec { return a.Add(b.Sub(a).MulScalar(t)) }

// IsZero reports whether all components are zero.
func (a Vec) IsZero() bool { return a.X == 0 && a.Y == 0 && a.Z == 0 }

// Finite reports whether no component is NaN or infinite.
func (a Vec) Finite() bool {
	// x-x is 0 for finite x and NaN for ±Inf or NaN.
	return a.X-a.X == 0 && a.Y-a.Y == 0 && a.Z-a.Z == 0
}

// Luminance returns the Rec. 709 luminance of a linear RGB colour.
func (a Vec) Luminance() float64 { return 0.2126*a.X + 0.7152*a.Y + 0.0722*a.Z }

// Reflect returns direction a mirrored about normal n (a points toward the surface).
func (a Vec) Reflect(n Vec) Vec { return a.Sub(n.MulScalar(2 * n.Dot(a))) }

// sqrt is math.Sqrt, short for the geometry code.
func sqrt(x float64) float64 { return math.Sqrt(x) }

// basis returns two unit vectors that form an orthonormal basis with unit n
// (Duff et al., "Building an Orthonormal Basis, Revisited").
func basis(n Vec) (Vec, Vec) {
	sign := math.Copysign(1, n.Z)
	a := -1 / (sign + n.Z)
	b := n.X * n.Y * a
	return Vec{1 + sign*n.X*n.X*a, sign * b, -sign * n.X}, Vec{b, sign + n.Y*n.Y*a, -n.Y}
}
