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
	centers []Vec
	nodes   []bvhNode
}

// buildBVH builds a BVH over refs, whose bounds are given in the same order.
func buildBVH(refs []primRef, bounds []box) bvh {
	if len(refs) == 0 {
		return bvh{}
	}
	b := &bvhBuilder{refs: refs, bounds: bounds, centers: make([]Vec, len(refs))}
	for i := range bounds {
		b.centers[i] = bounds[i].center()
	}
	b.nodes = make([]bvhNode, 0, 2*len(refs)/bvhLeafSize+1)
	b.build(0, len(refs), 0)
	return bvh{nodes: b.nodes, refs: b.refs}
}

// build emits the subtree over refs[lo:hi] and returns its node index.
func (b *bvhBuilder) build(lo, hi, depth int) int32 {
	bb, cb := emptyBox(), emptyBox()
	for i := lo; i < hi; i++ {
		bb = bb.extend(b.bounds[i])
		cb = cb.extendPoint(b.centers[i])
	}
	self := int32(len(b.nodes))
	b.nodes = append(b.nodes, bvhNode{lo: bb.lo, hi: bb.hi})
	n := hi - lo
	leaf := func() int32 {
		b.nodes[self].index = int32(lo)
		b.nodes[self].count = int32(n)
		return self
	}
	if n <= 1 {
		return leaf()
	}
	axis, mid := -1, 0
	if depth < bvhSAHDepth {
		axis, mid = b.sahSplit(lo, hi, bb, cb)
	}
	if axis < 0 {
		if n <= bvhLeafSize {
			return leaf()
		}
		axis, mid = b.medianSplit(lo, hi, cb)
	} else if mid < 0 { // SAH prefers a leaf
		return leaf()
	}
	b.nodes[self].axis = int32(axis)
	b.build(lo, mid, depth+1)
	b.nodes[self].index = b.build(mid, hi, depth+1)
	return self
}

// sahSplit bins centroids along each axis and partitions at the cheapest
// plane. It returns axis -1 when no binning is possible (all centroids
// coincide), and mid -1 when a leaf is cheaper than any split.
func (b *bvhBuilder) sahSplit(lo, hi int, bb, cb box) (axis, mid int) {
	type bin struct {
		b box
		n int
	}
	n := hi - lo
	bestCost, bestAxis, bestSplit := 0.0, -1, 0
	ext := cb.hi.Sub(cb.lo)
	for a := range 3 {
		e := ext.Axis(a)
		if !(e > 0) {
			continue
		}
		var bins [bvhBins]bin
		for i := range bins {
			bins[i].b = emptyBox()
		}
		k := bvhBins * (1 - 1e-9) / e
		base := cb.lo.Axis(a)
		for i := lo; i < hi; i++ {
			j := binIndex(b.centers[i].Axis(a), base, k)
			bins[j].b = bins[j].b.extend(b.bounds[i])
			bins[j].n++
		}
		var rightArea [bvhBins]float64
		var rightN [bvhBins]int
		acc, cnt := emptyBox(), 0
		for i := bvhBins - 1; i > 0; i-- {
			acc = acc.extend(bins[i].b)
			cnt += bins[i].n
			rightArea[i], rightN[i] = acc.area(), cnt
		}
		acc, cnt = emptyBox(), 0
		for i := 0; i < bvhBins-1; i++ {
			acc = acc.extend(bins[i].b)
			cnt += bins[i].n
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
	k := bvhBins * (1 - 1e-9) / ext.Axis(bestAxis)
	base := cb.lo.Axis(bestAxis)
	mid = b.partition(lo, hi, func(i int) bool {
		return binIndex(b.centers[i].Axis(bestAxis), base, k) < bestSplit
	})
	return bestAxis, mid
}

// binIndex maps a centroid coordinate to its bin.
func binIndex(c, base, k float64) int {
	j := int((c - base) * k)
	return max(0, min(bvhBins-1, j))
}

// medianSplit splits at the middle index along the widest centroid axis,
// ordering by centroid with a deterministic selection.
func (b *bvhBuilder) medianSplit(lo, hi int, cb box) (int, int) {
	ext := cb.hi.Sub(cb.lo)
	axis := 0
	if ext.Y > ext.X {
		axis = 1
	}
	if ext.Z > ext.Axis(axis) {
		axis = 2
	}
	mid := (lo + hi) / 2
	b.nthElement(lo, hi, mid, axis)
	return axis, mid
}

// nthElement reorders refs[lo:hi] so that refs before k have centroids not
// greater than those after it (quickselect with middle pivots: deterministic).
func (b *bvhBuilder) nthElement(lo, hi, k, axis int) {
	for hi-lo > 1 {
		p := b.centers[lo+(hi-lo)/2].Axis(axis)
		i, j := lo, hi-1
		for i <= j {
			for b.centers[i].Axis(axis) < p {
				i++
			}
			for b.centers[j].Axis(axis) > p {
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

// partition moves refs for which left is true to the front of [lo, hi) and
// returns the boundary.
func (b *bvhBuilder) partition(lo, hi int, left func(int) bool) int {
	i := lo
	for j := lo; j < hi; j++ {
		if left(j) {
			b.swap(i, j)
			i++
		}
	}
	return i
}

func (b *bvhBuilder) swap(i, j int) {
	b.refs[i], b.refs[j] = b.refs[j], b.refs[i]
	b.bounds[i], b.bounds[j] = b.bounds[j], b.bounds[i]
	b.centers[i], b.centers[j] = b.centers[j], b.centers[i]
}
