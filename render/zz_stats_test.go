package render

import "testing"

func TestZZStats(t *testing.T) {
	s := loadExample(t, "shot")
	w, _ := buildWorld(s, 5)
	leaves, inner, maxLeaf := 0, 0, 0
	for _, n := range w.bvh.nodes {
		if n.count > 0 { leaves++; maxLeaf = max(maxLeaf, int(n.count)) } else { inner++ }
	}
	t.Logf("tris %d nodes %d leaves %d inner %d maxleaf %d", len(w.tris), len(w.bvh.nodes), leaves, inner, maxLeaf)
	root := w.bvh.nodes[0]
	t.Logf("root %v %v", root.lo, root.hi)
}
