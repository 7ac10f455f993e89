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
	// Passes fixes the partition of a tile's samples into passes (see PassEnds) for renderers
	// whose bits depend on it (Cycles); 0 leaves it to the worker, as this renderer's bits do
	// not depend on it. Omitted when 0, so settings without it hash as before.
	Passes int `json:"passes,omitempty"`
	// Build is the fingerprint of the renderer a scene not rendered by this package needs
	// (Blender's version, Cycles kernel and BVH): workers of another build refuse its tiles.
	Build string `json:"build,omitempty"`
	// Channels is how many float values a pixel of a tile holds when not linear RGB (a Blender
	// frame's every view layer and pass); 0 is RGB, 3. Omitted when 0.
	Channels int `json:"channels,omitempty"`
	// Whole renders each frame as one tile in one pass, with what reads neighbouring pixels
	// while rendering (adaptive sampling) left on: how the farm keeps the picture of a scene
	// that cannot be split. Omitted when false.
	Whole bool `json:"whole,omitempty"`
}

// Values is how many float values one pixel of a tile of st holds.
func (st Settings) Values() int {
	if st.Channels > 0 {
		return st.Channels
	}
	return 3
}

// PassEnds returns the ends of the passes a tile renders its st.SPP samples in: pass i is
// samples [ends[i-1], ends[i]), in st.Passes equal parts when the settings fix them, else in
// passes parts (the worker's choice; at least one sample each).
func (st Settings) PassEnds(passes int) []int {
	if st.Passes > 0 {
		passes = st.Passes
	}
	passes = max(1, min(passes, st.SPP))
	ends := make([]int, passes)
	for i := range ends {
		ends[i] = int(int64(st.SPP) * int64(i+1) / int64(passes))
	}
	return ends
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
	if st.Passes != 0 || st.Build != "" || st.Channels != 0 || st.Whole {
		return sceneErr("settings.passes", "the built-in renderer takes no fixed passes or build: any partition of a tile's samples gives the same bits")
	}
	if err := ValidateSize(st); err != nil {
		return err
	}
	return validateNumbers(st)
}

// ValidateSize checks the image size and sample count every renderer shares the limits of.
func ValidateSize(st Settings) error {
	if err := checkRange("settings.width", st.Width, 1, MaxWidth); err != nil {
		return err
	}
	if err := checkRange("settings.height", st.Height, 1, MaxHeight); err != nil {
		return err
	}
	if int64(st.Width)*int64(st.Height) > MaxPixels {
		return sceneErr("settings.width", "width×height = %d pixels exceeds the limit of %d", int64(st.Width)*int64(st.Height), MaxPixels)
	}
	return checkRange("settings.spp", st.SPP, 1, MaxSPP)
}

// validateNumbers checks the numeric settings only this renderer has.
func validateNumbers(st Settings) error {
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
	Passes             int // only for renderers whose bits depend on the pass partition
	// Split asks for a scene that would render each frame whole (adaptive sampling) to be split
	// into tiles and passes anyway, with what cannot be split switched off: the artist's
	// explicit trade of the scene's picture for parallelism and resumption.
	Split bool
}

// Resolve returns the scene's settings with the overrides applied, validated: every command and
// the coordinator resolve a request's settings the same way, so they hash the same.
func (s *Scene) Resolve(o Overrides) (Settings, error) {
	st := s.Defaults()
	if o.Passes != 0 {
		return Settings{}, sceneErr("settings.passes", "passes apply to Blender scenes: the built-in renderer's tiles give the same bits however their samples are split")
	}
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
