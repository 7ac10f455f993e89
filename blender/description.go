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
	Step          int      `json:"frame_step"` // the frame step: every Step-th frame of the range renders
	ViewTransform string   `json:"view_transform"`
	Look          string   `json:"look"`
	Exposure      float64  `json:"exposure"`
	Gamma         float64  `json:"gamma"`
	// Whole says why the scene's frames render whole (one tile, one pass) to look as Blender
	// renders them, one line per setting (adaptive sampling...); empty when they split.
	Whole []string `json:"whole"`
	// SplitOff says what splitting such frames anyway (render.Overrides.Split) switches off.
	SplitOff []string `json:"split_off"`
	// Caveats say what the farm does differently from Blender in every mode (a denoiser this
	// Blender lacks, the sequencer, the GPU device), one line each.
	Caveats []string `json:"caveats"`
	// OnePass says why this build cannot split a tile's samples into passes (a sampling
	// pattern made for the sample count, on a line without sample subsets), empty if it can.
	OnePass         []string `json:"one_pass,omitempty"`
	Layers          []Layer  `json:"layers"` // the view layers rendered
	Output          Output   `json:"output"`
	FilmTransparent bool     `json:"film_transparent"`
	ShadowCatcher   bool     `json:"shadow_catcher"` // some object is a shadow catcher
	Volumes         bool     `json:"volumes"`        // some material or the world has a volume
	// Channels are every channel a tile renders, "Layer.Pass.Channel", as a render of the
	// prepared scene writes them: every view layer, every pass.
	Channels []string `json:"channels"`
	// WholeChannels are the channels of a frame rendered whole with the scene's own settings,
	// where they are not Channels: denoising adds its Noisy Image pass. Empty when they are.
	WholeChannels []string `json:"whole_channels,omitempty"`
	// Drop are channels of Channels (and WholeChannels) the tiles render only so that a light
	// pass combines across sample ranges, weighted by its colour pass the .blend does not ask
	// for: the assembled frame leaves them out, so the file written is the .blend's own.
	Drop  []string `json:"drop,omitempty"`
	Build string   `json:"build"` // the fingerprint of the Blender that inspected it
	// FileVersion is the Blender line that saved the .blend, from its header (FileVersion):
	// the line that renders it, or the nearest newer one (FitBuilds). "" in descriptions made
	// before it was recorded, which render on any build.
	FileVersion string `json:"file_version,omitempty"`
}

// Layer is a view layer rendered, with the passes whose names the artist chose.
type Layer struct {
	Name        string   `json:"name"`
	AOVs        []string `json:"aovs"`
	Lightgroups []string `json:"lightgroups"`
}

// Output is the file a render of the scene writes, as its Output Properties say, and the File
// Output nodes of its compositor.
type Output struct {
	FileFormat   string   `json:"file_format"` // PNG, OPEN_EXR, OPEN_EXR_MULTILAYER, JPEG, TIFF...
	ColorMode    string   `json:"color_mode"`  // BW, RGB, RGBA
	ColorDepth   string   `json:"color_depth"` // 8, 16, 32...
	EXRCodec     string   `json:"exr_codec"`
	Extension    string   `json:"extension"` // what Blender adds, ".exr"
	UseExtension bool     `json:"use_extension"`
	Path         string   `json:"path"`        // the output path, "//render/shot_" (relative to the .blend) or absolute
	Compositing  bool     `json:"compositing"` // the compositor runs after a render
	FileOutputs  []string `json:"file_outputs"`
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
	case d.FileVersion != "" && !validVersion(d.FileVersion):
		return bad("file version %q: want major.minor", d.FileVersion)
	case len(d.Channels) == 0:
		return bad("no channels")
	}
	for _, c := range d.Drop {
		if !slices.Contains(d.Channels, c) {
			return bad("channel %q to drop is not a channel of the tiles", c)
		}
	}
	for _, whole := range []bool{false, true} {
		if _, err := planChannels(d.mode(whole)); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// TileChannels are the channels a tile renders: Channels, or WholeChannels for a frame that
// renders whole where the scene has them.
func (d *Description) TileChannels(whole bool) []string { return d.mode(whole).Channels }

// mode is the description as a frame rendered whole (or not) sees it: its channels are the
// tiles'.
func (d *Description) mode(whole bool) *Description {
	if !whole || len(d.WholeChannels) == 0 {
		return d
	}
	c := *d
	c.Channels, c.WholeChannels = d.WholeChannels, nil
	return &c
}

// onePassWhy says why tiles of st render in one pass.
func (d *Description) onePassWhy(st render.Settings, plan *channelPlan) string {
	if st.Whole {
		return "the scene renders whole (" + strings.Join(d.Whole, "; ") + ")"
	}
	return "the scene has passes that cannot be combined across sample ranges (" + strings.Join(plan.onePass, "; ") + ")"
}

// Notes are the lines the artist reads at submit about how the farm renders the scene with o:
// whole or split and why, what splitting switches off, what differs from Blender anyway.
func (d *Description) Notes(o render.Overrides) []string {
	out := slices.Clone(d.Caveats)
	plan, err := planChannels(d)
	if err != nil {
		return out
	}
	switch {
	case len(d.Whole) > 0 && !o.Split:
		out = append(out, "each frame renders whole, as one tile in one pass, because "+strings.Join(d.Whole, "; ")+
			" (--split splits it, switching that off)")
	case len(d.Whole) > 0:
		out = append(out, d.SplitOff...)
	}
	if len(plan.onePass) > 0 && (len(d.Whole) == 0 || o.Split) {
		out = append(out, "each tile renders in one pass (no resume within a tile): "+strings.Join(plan.onePass, "; "))
	}
	return out
}

// Frames returns the scene's own frame range.
func (d *Description) Frames() (first, last int) { return d.FrameStart, d.FrameEnd }

// FrameStep is the .blend's frame step: the frames its own animation render renders.
func (d *Description) FrameStep() int { return max(d.Step, 1) }

// Assets lists the bundle's files, the .blend included.
func (d *Description) Assets() []string { return d.Files }

// Resolve returns the settings a job of this scene renders with: the .blend's own, with the
// overrides applied. The pass partition is fixed here, at submit, because Cycles' bits depend
// on it; the build fingerprint is in the settings, so every key and hash of the job carries
// it. Everything else the .blend decides is covered by the scene version.
func (d *Description) Resolve(o render.Overrides) (render.Settings, error) {
	st := render.Settings{Camera: d.Camera, Width: d.Width, Height: d.Height, SPP: d.SPP, Seed: d.Seed,
		MaxDepth: d.MaxBounces, Passes: o.Passes, Build: d.Build, Whole: len(d.Whole) > 0 && !o.Split}
	st.Channels = len(d.TileChannels(st.Whole))
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
	plan, err := planChannels(d)
	if err != nil {
		return render.Settings{}, fmt.Errorf("%w: %v", ErrScene, err)
	}
	switch {
	case st.Whole || len(plan.onePass) > 0:
		if o.Passes > 1 {
			return render.Settings{}, sceneErr("settings.passes: %s renders each tile in one pass", d.onePassWhy(st, plan))
		}
		st.Passes = 1
	case st.Passes == 0:
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
