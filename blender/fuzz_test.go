package blender_test

import (
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/blender"
	"github.com/tilefarm/tilefarm/render"
)

// FuzzParseDescription feeds the coordinator's parser of Blender scene descriptions, which
// come from clients: it must never panic, and what it accepts must resolve or fail cleanly
// and round-trip through Encode.
func FuzzParseDescription(f *testing.F) {
	good := &blender.Description{Format: blender.Format, Blend: "shots/a.blend", Files: []string{"shots/a.blend", "tex/b.png"},
		Scene: "Shot", Cameras: []string{"Cam", "Side"}, Camera: "Cam", Width: 160, Height: 120, SPP: 32, Seed: 7,
		MaxBounces: 6, FrameStart: 1, FrameEnd: 24, Whole: []string{}, SplitOff: []string{}, Caveats: []string{},
		Layers: []blender.Layer{{Name: "ViewLayer", AOVs: []string{}, Lightgroups: []string{}}}, Output: blender.Output{FileOutputs: []string{}},
		Channels: []string{"ViewLayer.Combined.A", "ViewLayer.Combined.B", "ViewLayer.Combined.G", "ViewLayer.Combined.R", "ViewLayer.Depth.Z"},
		Build:    "blender/3.4.1"}
	f.Add(good.Encode())
	f.Add([]byte(`{"format":"tilefarm-blender/1"}`))
	f.Add([]byte(`{"format":"tilefarm-blender/1","blend":"a.blend","files":["a.blend"],"cameras":["C"],"build":"b","frame_start":5,"frame_end":1}`))
	f.Add([]byte(`{"cameras":"C"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := blender.ParseDescription(data)
		if err != nil {
			return
		}
		if !blender.IsDescription(data) {
			t.Fatalf("parsed a document IsDescription does not recognise: %q", data)
		}
		if st, err := d.Resolve(render.Overrides{}); err == nil && (st.Passes < 1 || st.Passes > st.SPP || st.Build != d.Build) {
			t.Fatalf("resolved settings %+v break the pass or build rules", st)
		}
		back, err := blender.ParseDescription(d.Encode())
		if err != nil {
			t.Fatalf("an accepted description does not round-trip: %v", err)
		}
		if back.Blend != d.Blend || len(back.Files) != len(d.Files) || back.Build != d.Build {
			t.Fatalf("round trip changed the description: %+v vs %+v", back, d)
		}
	})
}

// Property: a .blend's frame step is the step of its default job, and a description without
// one (or of step 0) renders every frame.
func TestDescriptionFrameStep(t *testing.T) {
	for _, c := range []struct{ step, want int }{{0, 1}, {1, 1}, {3, 3}} {
		d := &blender.Description{Step: c.step}
		if got := d.FrameStep(); got != c.want {
			t.Errorf("frame_step %d: FrameStep() = %d, want %d", c.step, got, c.want)
		}
	}
}

// Property: a pass no rule combines exactly makes the scene's tiles render in one pass, and
// says why: DiffInd beside a volume (whose scattered light lands in it unweighted), a shadow
// catcher; without them the same channels split into the default passes.
func TestUncombinablePassesRenderInOnePass(t *testing.T) {
	base := blender.Description{Format: blender.Format, Blend: "a.blend", Files: []string{"a.blend"}, Cameras: []string{"Cam"},
		Camera: "Cam", Width: 64, Height: 48, SPP: 16, Build: "blender/3.4.1", FrameEnd: 1,
		Layers:   []blender.Layer{{Name: "ViewLayer"}},
		Channels: []string{"ViewLayer.Combined.A", "ViewLayer.Combined.R", "ViewLayer.DiffCol.R", "ViewLayer.DiffInd.R"}}
	for _, c := range []struct {
		name        string
		volumes, sc bool
		passes      int
		note        string
	}{
		{"plain", false, false, blender.DefaultPasses, ""},
		{"volume", true, false, 1, "DiffInd beside a volume"},
		{"shadow catcher", false, true, 1, "shadow catcher"},
	} {
		d := base
		d.Volumes, d.ShadowCatcher = c.volumes, c.sc
		st, err := d.Resolve(render.Overrides{})
		if err != nil || st.Passes != c.passes {
			t.Errorf("%s: passes %d, %v; want %d", c.name, st.Passes, err, c.passes)
		}
		notes := strings.Join(d.Notes(render.Overrides{}), "\n")
		if (c.note == "") != (notes == "") || !strings.Contains(notes, c.note) {
			t.Errorf("%s: notes %q, want one naming %q", c.name, notes, c.note)
		}
	}
}
