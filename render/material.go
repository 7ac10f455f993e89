package render

import "math"

// materialType is the kind of scattering a material does.
type materialType uint8

const (
	matDiffuse    materialType = iota // Lambertian
	matMetal                          // GGX microfacet conductor; roughness 0 is a perfect mirror
	matDielectric                     // smooth glass: Fresnel reflection and refraction
	matEmissive                       // a light: emits, scatters nothing
)

// materialTypes maps the scene-file names to material types.
var materialTypes = map[string]materialType{
	"diffuse":    matDiffuse,
	"metal":      matMetal,
	"dielectric": matDielectric,
	"emissive":   matEmissive,
}

// material is a parsed material.
type material struct {
	name     string
	typ      materialType
	color    Vec     // albedo / F0 / transmission tint
	alpha    float64 // GGX alpha = roughness²; 0 for a mirror
	ior      float64
	emission Vec // radiance, emission × strength
}

// specular reports whether the material scatters only into delta directions,
// in which case next-event estimation is useless.
func (m *material) specular() bool {
	return m.typ == matDielectric || (m.typ == matMetal && m.alpha == 0)
}

// bsdfSample is the outcome of sampling a material.
type bsdfSample struct {
	wi       Vec     // new direction (unit)
	weight   Vec     // f·|cos|/pdf
	pdf      float64 // solid-angle pdf; 0 for delta lobes
	specular bool
	ok       bool // false: the path is absorbed
}

// sample draws an incoming direction at a surface with shading normal n and
// geometric normal ng (both facing wo's side) for outgoing direction wo
// (unit, pointing away from the surface). front is false when the ray hit the
// back of the surface (inside a dielectric).
func (m *material) sample(wo, n, ng Vec, front bool, u1, u2 float64) bsdfSample {
	switch m.typ {
	case matDiffuse:
		t, b := basis(n)
		r := math.Sqrt(u1)
		s, c := math.Sincos(2 * math.Pi * u2)
		z := math.Sqrt(max(0, 1-u1))
		wi := t.MulScalar(r * c).Add(b.MulScalar(r * s)).Add(n.MulScalar(z))
		if wi.Dot(ng) <= 0 {
			return bsdfSample{}
		}
		return bsdfSample{wi: wi, weight: m.color, pdf: z / math.Pi, ok: true}
	case matMetal:
		if m.alpha == 0 {
			wi := wo.Negate().Reflect(n)
			if wi.Dot(ng) <= 0 {
				return bsdfSample{}
			}
			return bsdfSample{wi: wi, weight: schlick(m.color, wo.Dot(n)), specular: true, ok: true}
		}
		return m.sampleGGX(wo, n, ng, u1, u2)
	case matDielectric:
		return m.sampleGlass(wo, n, front, u1)
	}
	return bsdfSample{}
}

// eval returns f·|cos θi| and the solid-angle pdf that sample would have used
// for direction wi. Delta lobes evaluate to zero.
func (m *material) eval(wo, wi, n, ng Vec) (Vec, float64) {
	if wi.Dot(ng) <= 0 {
		return Vec{}, 0
	}
	cosI := wi.Dot(n)
	if cosI <= 0 {
		return Vec{}, 0
	}
	switch m.typ {
	case matDiffuse:
		return m.color.MulScalar(cosI / math.Pi), cosI / math.Pi
	case matMetal:
		if m.alpha == 0 {
			return Vec{}, 0
		}
		cosO := wo.Dot(n)
		if cosO <= 0 {
			return Vec{}, 0
		}
		h := wo.Add(wi).Normalize()
		cosH := h.Dot(n)
		woH := wo.Dot(h)
		if cosH <= 0 || woH <= 0 {
			return Vec{}, 0
		}
		d := ggxD(cosH, m.alpha)
		g := ggxG1(cosO, m.alpha) * ggxG1(cosI, m.alpha)
		f := schlick(m.color, wi.Dot(h))
		// f·cosI = F·D·G/(4·cosO)
		return f.MulScalar(d * g / (4 * cosO)), d * cosH / (4 * woH)
	}
	return Vec{}, 0
}

// sampleGGX samples a half vector from D(h)·cos θh and reflects wo about it.
func (m *material) sampleGGX(wo, n, ng Vec, u1, u2 float64) bsdfSample {
	cosO := wo.Dot(n)
	if cosO <= 0 {
		return bsdfSample{}
	}
	a2 := m.alpha * m.alpha
	cos2 := (1 - u1) / (1 + (a2-1)*u1)
	cosT := math.Sqrt(cos2)
	sinT := math.Sqrt(max(0, 1-cos2))
	s, c := math.Sincos(2 * math.Pi * u2)
	t, b := basis(n)
	h := t.MulScalar(sinT * c).Add(b.MulScalar(sinT * s)).Add(n.MulScalar(cosT))
	woH := wo.Dot(h)
	if woH <= 0 {
		return bsdfSample{}
	}
	wi := h.MulScalar(2 * woH).Sub(wo)
	cosI := wi.Dot(n)
	if cosI <= 0 || wi.Dot(ng) <= 0 {
		return bsdfSample{}
	}
	d := ggxD(cosT, m.alpha)
	pdf := d * cosT / (4 * woH)
	g := ggxG1(cosO, m.alpha) * ggxG1(cosI, m.alpha)
	f := schlick(m.color, wi.Dot(h))
	// weight = F·D·G/(4 cosO cosI) · cosI / pdf = F·G·woH/(cosO·cosH)
	return bsdfSample{wi: wi, weight: f.MulScalar(g * woH / (cosO * cosT)), pdf: pdf, ok: true}
}

// sampleGlass picks reflection or refraction by the Fresnel reflectance.
func (m *material) sampleGlass(wo, n Vec, front bool, u float64) bsdfSample {
	eta := 1 / m.ior // n1/n2 when entering
	if !front {
		eta = m.ior
	}
	cosI := min(1, wo.Dot(n))
	sin2T := eta * eta * max(0, 1-cosI*cosI)
	var fr float64
	var cosT float64
	if sin2T >= 1 {
		fr = 1 // total internal reflection
	} else {
		cosT = math.Sqrt(1 - sin2T)
		fr = fresnelDielectric(cosI, cosT, eta)
	}
	if u < fr {
		return bsdfSample{wi: wo.Negate().Reflect(n), weight: Vec{1, 1, 1}, specular: true, ok: true}
	}
	wi := wo.Negate().MulScalar(eta).Add(n.MulScalar(eta*cosI - cosT)).Normalize()
	return bsdfSample{wi: wi, weight: m.color, specular: true, ok: true}
}

// fresnelDielectric is the unpolarised Fresnel reflectance for relative index
// eta = n1/n2.
func fresnelDielectric(cosI, cosT, eta float64) float64 {
	rs := (eta*cosI - cosT) / (eta*cosI + cosT)
	rp := (cosI - eta*cosT) / (cosI + eta*cosT)
	return 0.5 * (rs*rs + rp*rp)
}

// schlick approximates the Fresnel reflectance of a conductor with
// normal-incidence colour f0.
func schlick(f0 Vec, cosTheta float64) Vec {
	m := 1 - max(0, min(1, cosTheta))
	m5 := m * m * m * m * m
	return f0.Add(Vec{1, 1, 1}.Sub(f0).MulScalar(m5))
}

// ggxD is the GGX (Trowbridge-Reitz) normal distribution.
func ggxD(cosH, alpha float64) float64 {
	a2 := alpha * alpha
	d := cosH*cosH*(a2-1) + 1
	return a2 / (math.Pi * d * d)
}

// ggxG1 is Smith's masking term for GGX.
func ggxG1(cosV, alpha float64) float64 {
	c2 := cosV * cosV
	tan2 := max(0, 1-c2) / c2
	return 2 / (1 + math.Sqrt(1+alpha*alpha*tan2))
}
