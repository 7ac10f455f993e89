package worker

import "sync/atomic"

// idleSlots counts a worker's tile slots that found no work when they last asked: their
// threads would idle while another slot renders, so a tile renders its next pass with their
// threads too (threadedTile). A frame that renders whole (adaptive sampling, a denoiser) is
// one tile: on a worker of two one-thread slots it rendered on one core while the other idled
// (docs/design.md, "Renderers": lent threads). Threads never change a pixel (every Blender
// line and the path tracer write the same bits with any), so lending only changes how fast a
// pass renders. A slot that takes work while its threads are lent starts its tile at once; the
// node's cores are then oversubscribed until the lending pass ends, and the next pass of the
// borrowing tile counts again.
type idleSlots struct{ n atomic.Int32 }

// count is how many tile slots are idle now.
func (s *idleSlots) count() int {
	if s == nil {
		return 0
	}
	return int(s.n.Load())
}

// idleSlot is one slot's own part of an idleSlots count, so that it counts at most once.
type idleSlot struct{ counted bool }

// set counts the slot in s as idle or not (nothing when s is nil: a loop that lends nothing).
func (o *idleSlot) set(s *idleSlots, idle bool) {
	if s == nil || o.counted == idle {
		return
	}
	o.counted = idle
	if idle {
		s.n.Add(1)
	} else {
		s.n.Add(-1)
	}
}

// threadedTile is a tile that can render its passes on more threads than its slot's own
// (blender.Tile, render.Tile).
type threadedTile interface {
	Threads() int
	SetThreads(n int)
}

// lender gives a tile's passes the threads of the worker's idle slots on top of its own.
type lender struct {
	tile threadedTile // nil: a tile that cannot use more threads
	base int          // the tile's own threads
	idle *idleSlots
}

// newLender is the lender of t, which renders on its own threads until a pass finds slots idle.
func newLender(t any, idle *idleSlots) lender {
	tt, ok := t.(threadedTile)
	if !ok {
		return lender{}
	}
	return lender{tile: tt, base: tt.Threads(), idle: idle}
}

// beforePass sets the threads of the tile's next pass: its own, and those of every slot idle
// now. It returns them.
func (l lender) beforePass() int {
	if l.tile == nil {
		return 0
	}
	n := l.base * (1 + l.idle.count())
	l.tile.SetThreads(n)
	return n
}
