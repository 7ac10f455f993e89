package blender_test

import (
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
