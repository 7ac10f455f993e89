package raster

import "math"

// ACES filmic curve coefficients, Narkowicz 2015 fit.
const (
	acesA = 2.51
	acesB = 0.03
	acesC = 2.43
	acesD = 0.59
	acesE = 0.14
)

// ToneMap maps one linear channel value to a display value in [0,1]:
//
//  1. scale by 2^exposure (exposure in stops, 0 = unchanged);
//  2. ACES filmic curve, Krzysztof Narkowicz's 2015 fit, applied per channel
//     and without the fit's optional 0.6 pre-scale:
//     f(x) = x(2.51x + 0.03) / (x(2.43x + 0.59) + 0.14);
//  3. sRGB OETF: 12.92x below 0.0031308, else 1.055x^(1/2.4) - 0.055;
//  4. clamp to [0,1].
//
// Negative values and NaN map to 0, +Inf to 1. The curve is monotonic on
// [0,inf) and reaches 1 near x = 7.2. The computation is float64 and uses no
// state, so the same input gives the same output on every worker of a build.
// ACES was chosen over Reinhard because it keeps contrast in the mid-tones
// and rolls highlights off to pure white instead of approaching it forever.
func ToneMap(linear, exposure float64) float64 {
	if math.IsNaN(linear) || linear <= 0 {
		return 0
	}
	x := linear * math.Exp2(exposure)
	if math.IsInf(x, 1) {
		return 1
	}
	x = (x * (acesA*x + acesB)) / (x*(acesC*x+acesD) + acesE)
	if math.IsNaN(x) {
		return 1 // huge x: Inf/Inf; the curve's limit clamps to 1
	}
	x = min(max(x, 0), 1)
	return min(max(srgbOETF(x), 0), 1)
}

// srgbOETF encodes a linear value in [0,1] with the sRGB transfer function.
func srgbOETF(x float64) float64 {
	if x >= 1 {
		return 1 // exactly white; the formula gives 1-ulp
	}
	if x <= 0.0031308 {
		return 12.92 * x
	}
	return 1.055*math.Pow(x, 1/2.4) - 0.055
}

// quantize maps a display value in [0,1] to an integer in [0,maxV], rounding
// half away from zero.
func quantize(v float64, maxV int) int {
	return int(math.Round(v * float64(maxV)))
}

// ToneMap8 returns the 8-bit sRGB code of a linear value.
func ToneMap8(linear, exposure float64) uint8 { return uint8(quantize(ToneMap(linear, exposure), 255)) }

// ToneMap16 returns the 16-bit sRGB code of a linear value.
func ToneMap16(linear, exposure float64) uint16 {
	return uint16(quantize(ToneMap(linear, exposure), 65535))
}
