package coorddb

import (
	"fmt"
	"testing"
)

// A frame's tile objects keep each tile's reported object under the frame's one build: a tile
// reported with another build, or with an attempt or sha256 the farm does not make, is not
// kept, and a forgotten tile is unknown again.
func TestTileObjects(t *testing.T) {
	o := NewTileObjects(3)
	if o.Build() != "" || o.Len() != 3 || o.Get(0) != "" {
		t.Fatalf("a new table: build %q, %d tiles, tile 0 %q", o.Build(), o.Len(), o.Get(0))
	}
	sum := fmt.Sprintf("%064x", 7)
	o = o.Set(0, "00000000000000aa", sum, "b1")
	o = o.Set(1, "00000000000000bb", sum, "b2") // another build
	o = o.Set(2, "not-hex", sum, "b1")          // not an attempt id
	if err := o.check(3); err != nil || o.Build() != "b1" {
		t.Fatalf("after Set: %v, build %q", err, o.Build())
	}
	if got := o.Get(0); got != "00000000000000aa:"+sum {
		t.Fatalf("tile 0 = %q", got)
	}
	if o.Get(1) != "" || o.Get(2) != "" {
		t.Fatalf("kept a tile of another build or a bad attempt: %q %q", o.Get(1), o.Get(2))
	}
	o.Forget(0)
	if o.Get(0) != "" {
		t.Fatal("a forgotten tile is still known")
	}
}
