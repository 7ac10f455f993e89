package render

import (
	"math"
	"strconv"
)

// Settings are the resolved render settings of a frame. The farm hashes their
// canonical JSON (with Version) into the settings hash, so every field that
// changes pixels belongs here.
type Settings struct {
	Camera   string  `json:"camera"`
	Width    int     `json:"width"`
	Height   int     `json:"height"`
	SPP      int     `json:"spp"`
	MaxDepth int     `json:"max_depth"`
	Seed     uint64  `json:"seed"`
	Exposure float64 `json:"exposure"` // EV stops, used by tone mapping in finalize (render ignores it)
}

// Limits on settings: anything beyond them is rejected as absurd rather than
// left to exhaust memory or time.
const (
	MaxWidth    = 16384
	MaxHeight   = 16384
	MaxPixels   = 64 << 20
	MaxSPP      = 1 << 20
	MaxMaxDepth = 1024
)

// Default settings used when the scene file leaves them out.
const (
	defaultWidth    = 320
	defaultHeight   = 240
	defaultSPP      = 16
	defaultMaxDepth = 8
)

// Validate checks st against the scene: the camera must exist and every
// number must be within the limits above. The error is a *SceneError naming
// the field ("settings.spp").
func (s *Scene) Validate(st Settings) error {
	if s.cameraIndex(st.Camera) < 0 {
		return sceneErr("settings.camera", "unknown camera %q (have %s)", st.Camera, quoteList(s.Cameras()))
	}
	return validateNumbers(st)
}

// validateNumbers checks the numeric settings.
func validateNumbers(st Settings) error {
	if err := checkRange("settings.width", st.Width, 1, MaxWidth); err != nil {
		return err
	}
	if err := checkRange("settings.height", st.Height, 1, MaxHeight); err != nil {
		return err
	}
	if int64(st.Width)*int64(st.Height) > MaxPixels {
		return sceneErr("settings.width", "width×height = %d pixels exceeds the limit of %d", int64(st.Width)*int64(st.Height), MaxPixels)
	}
	if err := checkRange("settings.spp", st.SPP, 1, MaxSPP); err != nil {
		return err
	}
	if err := checkRange("settings.max_depth", st.MaxDepth, 1, MaxMaxDepth); err != nil {
		return err
	}
	if math.IsNaN(st.Exposure) || math.IsInf(st.Exposure, 0) {
		return sceneErr("settings.exposure", "must be a finite number, got %v", st.Exposure)
	}
	if math.Abs(st.Exposure) > 64 {
		return sceneErr("settings.exposure", "must be within ±64 EV, got %v", st.Exposure)
	}
	return nil
}

// checkRange rejects v outside [lo, hi].
func checkRange(field string, v, lo, hi int) error {
	if v < lo || v > hi {
		return sceneErr(field, "must be between %d and %d, got %d", lo, hi, v)
	}
	return nil
}

// quoteList formats names for error messages.
func quoteList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	s := ""
	for i, n := range names {
		if i > 0 {
			s += ", "
		}
		s += strconv.Quote(n)
	}
	return s
}

// Overrides are the settings a request may change; zero fields keep the scene file's value.
type Overrides struct {
	Camera             string
	Width, Height, SPP int
}

// Resolve returns the scene's settings with the overrides applied, validated: every command and
// the coordinator resolve a request's settings the same way, so they hash the same.
func (s *Scene) Resolve(o Overrides) (Settings, error) {
	st := s.Defaults()
	if o.Camera != "" {
		st.Camera = o.Camera
	}
	for _, f := range []struct {
		v   int
		dst *int
	}{{o.Width, &st.Width}, {o.Height, &st.Height}, {o.SPP, &st.SPP}} {
		if f.v != 0 {
			*f.dst = f.v
		}
	}
	if err := s.Validate(st); err != nil {
		return Settings{}, err
	}
	return st, nil
}
