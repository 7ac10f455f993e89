package blender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/render"
)

// Format tags a scene description; a scene bundle whose scene document carries it is a
// Blender scene.
const Format = "tilefarm-blender/1"

// DefaultPasses is how many passes a Blender tile's samples are split into when the
// submission does not say: each pass is one Blender render call (a scene sync and a BVH build
// on top of its samples), and each is a checkpoint a killed tile resumes from.
const DefaultPasses = 4

// Description is the scene document of a Blender scene bundle: what Inspect learned from
// Blender about the .blend, so the coordinator can resolve settings and split frames without
// running Blender. The .blend and every file it depends on are the bundle's assets, named by
// their path relative to a common root, so the .blend's relative paths still find them.
type Description struct {
	Format        string   `json:"format"`
	Blend         string   `json:"blend"` // the .blend's name in the bundle
	Files         []string `json:"files"` // every asset of the bundle, the .blend included, sorted
	Scene         string   `json:"scene"`
	Cameras       []string `json:"cameras"`
	Camera        string   `json:"camera"` // the scene's active camera, "" if none is set
	Width         int      `json:"width"`
	Height        int      `json:"height"`
	SPP           int      `json:"spp"`
	Seed          uint64   `json:"seed"`
	MaxBounces    int      `json:"max_bounces"`
	FrameStart    int      `json:"frame_start"`
	FrameEnd      int      `json:"frame_end"`
	ViewTransform string   `json:"view_transform"`
	Look          string   `json:"look"`
	Exposure      float64  `json:"exposure"`
	Gamma         float64  `json:"gamma"`
	SwitchedOff   []string `json:"switched_off"` // one line per setting that cannot be split
	Build         string   `json:"build"`        // the fingerprint of the Blender that inspected it
}

// IsDescription reports whether a scene document is a Blender scene description.
func IsDescription(doc []byte) bool {
	var head struct {
		Format string `json:"format"`
	}
	return bytes.HasPrefix(bytes.TrimSpace(doc), []byte("{")) && json.Unmarshal(doc, &head) == nil && head.Format == Format
}

// ParseDescription decodes and validates a scene description.
func ParseDescription(doc []byte) (*Description, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	var d Description
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadDescription, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the description", ErrBadDescription)
	}
	if err := d.validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Encode returns the description as its scene document.
func (d *Description) Encode() []byte {
	b, _ := json.MarshalIndent(d, "", "  ") // plain data: cannot fail
	return append(b, '\n')
}

func (d *Description) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadDescription, fmt.Sprintf(format, args...))
	}
	switch {
	case d.Format != Format:
		return bad("format %q, want %q", d.Format, Format)
	case !strings.HasSuffix(d.Blend, ".blend"):
		return bad("blend %q is not a .blend file", d.Blend)
	case !slices.Contains(d.Files, d.Blend):
		return bad("the .blend %q is not among the files", d.Blend)
	case !slices.IsSorted(d.Files) || len(slices.Compact(slices.Clone(d.Files))) != len(d.Files):
		return bad("files are not sorted and unique")
	case len(d.Cameras) == 0:
		return bad("the scene has no camera")
	case d.Camera != "" && !slices.Contains(d.Cameras, d.Camera):
		return bad("active camera %q is not among the cameras", d.Camera)
	case d.FrameEnd < d.FrameStart:
		return bad("frame range %d-%d is reversed", d.FrameStart, d.FrameEnd)
	case d.Build == "":
		return bad("no build fingerprint")
	}
	return nil
}

// Frames returns the scene's own frame range.
func (d *Description) Frames() (first, last int) { return d.FrameStart, d.FrameEnd }

// Assets lists the bundle's files, the .blend included.
func (d *Description) Assets() []string { return d.Files }

// Resolve returns the settings a job of this scene renders with: the .blend's own, with the
// overrides applied. The pass partition is fixed here, at submit, because Cycles' bits depend
// on it; the build fingerprint is in the settings, so every key and hash of the job carries
// it. Everything else the .blend decides is covered by the scene version.
func (d *Description) Resolve(o render.Overrides) (render.Settings, error) {
	st := render.Settings{Camera: d.Camera, Width: d.Width, Height: d.Height, SPP: d.SPP, Seed: d.Seed,
		MaxDepth: d.MaxBounces, Passes: o.Passes, Build: d.Build}
	if o.Camera != "" {
		if !slices.Contains(d.Cameras, o.Camera) {
			return render.Settings{}, sceneErr("settings.camera: the scene has no camera %q (have %s)", o.Camera, strings.Join(d.Cameras, ", "))
		}
		st.Camera = o.Camera
	}
	if st.Camera == "" {
		return render.Settings{}, sceneErr("settings.camera: the scene has no active camera; choose one of %s with --camera", strings.Join(d.Cameras, ", "))
	}
	for _, f := range []struct {
		v   int
		dst *int
	}{{o.Width, &st.Width}, {o.Height, &st.Height}, {o.SPP, &st.SPP}} {
		if f.v != 0 {
			*f.dst = f.v
		}
	}
	if st.Passes == 0 {
		st.Passes = min(DefaultPasses, max(st.SPP, 1))
	}
	if err := render.ValidateSize(st); err != nil {
		return render.Settings{}, fmt.Errorf("%w: %v", ErrScene, err)
	}
	if st.Passes < 1 || st.Passes > st.SPP {
		return render.Settings{}, sceneErr("settings.passes: must be between 1 and the %d samples, got %d", st.SPP, st.Passes)
	}
	return st, nil
}
