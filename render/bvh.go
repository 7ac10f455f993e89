package render

// The BVH is built with binned SAH over every bounded primitive (spheres,
// quads, triangles), flattened into an array in depth-first order (a node's
// first child directly follows it) and traversed iteratively with a fixed-size
// stack, so intersection never allocates.

const (
	primSphere   = 0
	primQuad     = 1
	primTriangle = 2

	refKindShift = 30
	refIndexMask = 1<<refKindShift - 1

	bvhBins     = 16
	bvhLeafSize = 4  // leaves at or below this size when SAH says so
	bvhMaxLeaf  = 16 // a node above this size is always split
	bvhSAHDepth = 48 // below this depth, split at the median: bounds the stack
	bvhStack    = 96
)

// primRef packs a primitive kind (top 2 bits) and its index in its slice.
type primRef uint32

func makeRef(kind, i int) primRef { return primRef(uint32(kind)<<refKindShift | uint32(i)) }
func (r primRef) kind() int       { return int(r >> refKindShift) }
func (r primRef) index() int      { return int(r & refIndexMask) }

// bvhNode is 64 bytes: one cache line.
type bvhNode struct {
	lo, hi Vec
	index  int32 // leaf: first ref; inner: index of the second child
	count  int32 // leaf: number of refs (>0); inner: 0
	axis   int32 // inner: split axis, to visit the near child first
	_      int32
}

// bvh is the flattened hierarchy and the primitive order its leaves use.
type bvh struct {
	nodes []bvhNode
	refs  []primRef
}

// bvhBuilder holds the per-primitive data needed only while building.
type bvhBuilder struct {
	refs    []primRef
	bounds  []box
	centers [][3]float64
	nodes   []bvhNode
	bins    [3][bvhBins]bvhBin // scratch for sahSplit
}

// bvhBin accumulates the primitives whose centroids fall in one SAH bin.
type bvhBin struct {
	b box
	n int
}

// buildBVH builds a BVH over refs, whose bounds are given in the same order.
// The result depends only on the input order, never on timing.
func buildBVH(refs []primRef, bounds []box) bvh {
	if len(refs) == 0 {
		return bvh{}
	}
	b := &bvhBuilder{refs: refs, bounds: bounds, centers: make([][3]float64, len(refs))}
	for i := range bounds {
		c := bounds[i].center()
		b.centers[i] = [3]float64{c.X, c.Y, c.Z}
	}
	b.nodes = make([]bvhNode, 0, len(refs)+len(refs)/4+1)
	b.build(0, len(refs), 0)
	return bvh{nodes: b.nodes, refs: b.refs}
}

// fmin and fmax are min and max without the NaN and signed-zero handling of
// the builtins (inputs here are finite): they compile to plain compares.
func fmin(a, b float64) float64 {
	if a < b {
		return a
	}
	return b
}

func fmax(a, b float64) float64 {
	if a > b {
		return a
	}
	return b
}

// grow extends a to contain o, in place.
func (a *box) grow(o *box) {
	a.lo = Vec{fmin(a.lo.X, o.lo.X), fmin(a.lo.Y, o.lo.Y), fmin(a.lo.Z, o.lo.Z)}
	a.hi = Vec{fmax(a.hi.X, o.hi.X), fmax(a.hi.Y, o.hi.Y), fmax(a.hi.Z, o.hi.Z)}
}

// build emits the subtree over refs[lo:hi] and returns its node index.
func (b *bvhBuilder) build(lo, hi, depth int) int32 {
	bb := emptyBox()
	var cmin, cmax [3]float64
	cmin = b.centers[lo]
	cmax = cmin
	for i := lo; i < hi; i++ {
		bb.grow(&b.bounds[i])
		c := &b.centers[i]
		for a := range 3 {
			cmin[a] = fmin(cmin[a], c[a])
			cmax[a] = fmax(cmax[a], c[a])
		}
	}
	self := int32(len(b.nodes))
	b.nodes = append(b.nodes, bvhNode{lo: bb.lo, hi: bb.hi})
	n := hi - lo
	leaf := func() int32 {
		b.nodes[self].index = int32(lo)
		b.nodes[self].count = int32(n)
		return self
	}
	if n <= 2 {
		return leaf()
	}
	axis, mid := -1, 0
	if depth < bvhSAHDepth {
		axis, mid = b.sahSplit(lo, hi, bb, cmin, cmax)
	}
	if axis < 0 {
		if n <= bvhLeafSize {
			return leaf()
		}
		axis, mid = b.medianSplit(lo, hi, cmin, cmax)
	} else if mid < 0 { // SAH prefers a leaf
		return leaf()
	}
	b.nodes[self].axis = int32(axis)
	b.build(lo, mid, depth+1)
	b.nodes[self].index = b.build(mid, hi, depth+1)
	return self
}

// sahSplit bins centroids along all three axes in one pass and partitions
// at the cheapest plane. It returns axis -1 when no binning is possible (all
// centroids coincide), and mid -1 when a leaf is cheaper than any split.
func (b *bvhBuilder) sahSplit(lo, hi int, bb box, cmin, cmax [3]float64) (axis, mid int) {
	n := hi - lo
	nb := min(bvhBins, n)
	bins := &b.bins
	var k [3]float64
	for a := range 3 {
		if e := cmax[a] - cmin[a]; e > 0 {
			k[a] = float64(nb) * (1 - 1e-9) / e
		}
		for i := range nb {
			bins[a][i] = bvhBin{b: emptyBox()}
		}
	}
	for i := lo; i < hi; i++ {
		c := &b.centers[i]
		for a := range 3 {
			if k[a] == 0 {
				continue
			}
			j := binIndex(c[a], cmin[a], k[a], nb)
			bins[a][j].b.grow(&b.bounds[i])
			bins[a][j].n++
		}
	}
	bestCost, bestAxis, bestSplit := 0.0, -1, 0
	for a := range 3 {
		if k[a] == 0 {
			continue
		}
		var rightArea [bvhBins]float64
		var rightN [bvhBins]int
		acc, cnt := emptyBox(), 0
		for i := nb - 1; i > 0; i-- {
			acc.grow(&bins[a][i].b)
			cnt += bins[a][i].n
			rightArea[i], rightN[i] = acc.area(), cnt
		}
		acc, cnt = emptyBox(), 0
		for i := 0; i < nb-1; i++ {
			acc.grow(&bins[a][i].b)
			cnt += bins[a][i].n
			if cnt == 0 || rightN[i+1] == 0 {
				continue
			}
			cost := acc.area()*float64(cnt) + rightArea[i+1]*float64(rightN[i+1])
			if bestAxis < 0 || cost < bestCost {
				bestCost, bestAxis, bestSplit = cost, a, i+1
			}
		}
	}
	if bestAxis < 0 {
		return -1, 0
	}
	// Relative cost: traversal 1/8 of a primitive test.
	area := bb.area()
	if n <= bvhMaxLeaf && area > 0 && 0.125+bestCost/area >= float64(n) {
		return bestAxis, -1
	}
	ka, base := k[bestAxis], cmin[bestAxis]
	i := lo
	for j := lo; j < hi; j++ {
		if binIndex(b.centers[j][bestAxis], base, ka, nb) < bestSplit {
			b.swap(i, j)
			i++
		}
	}
	return bestAxis, i
}

// binIndex maps a centroid coordinate to one of nb bins.
func binIndex(c, base, k float64, nb int) int {
	j := int((c - base) * k)
	return max(0, min(nb-1, j))
}

// medianSplit splits at the middle index along the widest centroid axis,
// ordering by centroid with a deterministic selection.
func (b *bvhBuilder) medianSplit(lo, hi int, cmin, cmax [3]float64) (int, int) {
	axis := 0
	for a := 1; a < 3; a++ {
		if cmax[a]-cmin[a] > cmax[axis]-cmin[axis] {
			axis = a
		}
	}
	mid := (lo + hi) / 2
	b.nthElement(lo, hi, mid, axis)
	return axis, mid
}

// nthElement reorders refs[lo:hi] so that refs before k have centroids not
// greater than those after it (quickselect with middle pivots: deterministic).
func (b *bvhBuilder) nthElement(lo, hi, k, axis int) {
	for hi-lo > 1 {
		p := b.centers[lo+(hi-lo)/2][axis]
		i, j := lo, hi-1
		for i <= j {
			for b.centers[i][axis] < p {
				i++
			}
			for b.centers[j][axis] > p {
				j--
			}
			if i <= j {
				b.swap(i, j)
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j + 1
		case k >= i:
			lo = i
		default:
			return
		}
	}
}

func (b *bvhBuilder) swap(i, j int) {
	b.refs[i], b.refs[j] = b.refs[j], b.refs[i]
	b.bounds[i], b.bounds[j] = b.bounds[j], b.bounds[i]
	b.centers[i], b.centers[j] = b.centers[j], b.centers[i]
}
