package render

import (
	"strings"
	"testing"
)

func TestResolveAppliesOnlyGivenOverrides(t *testing.T) {
	s, err := LoadSceneFile("../examples/shot/scene.json")
	if err != nil {
		t.Fatal(err)
	}
	def := s.Defaults()
	st, err := s.Resolve(Overrides{})
	if err != nil || st != def {
		t.Fatalf("no overrides: %+v, %v; want the defaults %+v", st, err, def)
	}
	st, err = s.Resolve(Overrides{Width: 32, SPP: 3})
	if err != nil || st.Width != 32 || st.SPP != 3 || st.Height != def.Height || st.Camera != def.Camera {
		t.Fatalf("width and spp overridden: %+v, %v", st, err)
	}
	if _, err := s.Resolve(Overrides{Camera: "nope"}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown camera: %v", err)
	}
	if _, err := s.Resolve(Overrides{SPP: -1}); err == nil || !strings.Contains(err.Error(), "spp") {
		t.Fatalf("negative spp: %v", err)
	}
}
