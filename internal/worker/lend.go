package worker

import "sync"

// idleSlots counts a worker's tile slots that found no work when they last asked: their
// threads would idle while another slot renders, so a tile borrows them for its next pass
// (lender). A frame that renders whole (adaptive sampling, a denoiser) is one tile: on a worker
// of two one-thread slots it rendered on one core while the other idled (docs/design.md,
// "Renderers": lent threads). Threads never change a pixel (every Blender line and the path
// tracer write the same bits with any), so lending only changes how fast a pass renders. Each
// idle slot is lent to one pass at a time. A slot that takes work while its threads are lent
// starts its tile at once: the node's cores are then oversubscribed until the lending pass
// ends, and that slot is not lent again until it is idle again.
type idleSlots struct {
	mu   sync.Mutex
	idle int // slots idle now
	lent int // of the slots idle when they were borrowed, how many passes still hold
}

// borrow lends every idle slot no pass holds yet and returns how many (0 for a nil count: a
// loop that lends nothing).
func (s *idleSlots) borrow() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := max(s.idle-s.lent, 0)
	s.lent += k
	return k
}

// giveBack returns k slots a pass borrowed.
func (s *idleSlots) giveBack(k int) {
	if s == nil || k == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lent -= k
}

// count is how many tile slots are idle now.
func (s *idleSlots) count() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idle
}

// idleSlot is one slot's own part of an idleSlots count, so that it counts at most once. Only
// its slot's loop uses it.
type idleSlot struct{ counted bool }

// set counts the slot in s as idle or not (nothing when s is nil).
func (o *idleSlot) set(s *idleSlots, idle bool) {
	if s == nil || o.counted == idle {
		return
	}
	o.counted = idle
	s.mu.Lock()
	defer s.mu.Unlock()
	if idle {
		s.idle++
	} else {
		s.idle--
	}
}

// threadedTile is a tile that can render its passes on more threads than its slot's own
// (blender.Tile, render.Tile).
type threadedTile interface {
	Threads() int
	SetThreads(n int)
}

// lender gives a tile's passes the threads of the worker's idle slots on top of its own, one
// pass at a time. A lender is used by its tile's run alone.
type lender struct {
	tile     threadedTile // nil: a tile that cannot use more threads
	base     int          // the tile's own threads
	idle     *idleSlots
	borrowed int // slots the pass rendering now holds
}

// newLender is the lender of t, which renders on its own threads until a pass finds slots idle.
func newLender(t any, idle *idleSlots) *lender {
	tt, ok := t.(threadedTile)
	if !ok {
		return &lender{}
	}
	return &lender{tile: tt, base: tt.Threads(), idle: idle}
}

// beforePass sets the threads of the tile's next pass, its own and those of the idle slots it
// borrows, and returns them and whether it borrowed any; afterPass gives the slots back.
func (l *lender) beforePass() (threads int, lent bool) {
	if l == nil || l.tile == nil {
		return 0, false
	}
	l.afterPass()
	l.borrowed = l.idle.borrow()
	n := l.base * (1 + l.borrowed)
	l.tile.SetThreads(n)
	return n, l.borrowed > 0
}

// afterPass gives back the slots the last pass borrowed.
func (l *lender) afterPass() {
	if l == nil {
		return
	}
	l.idle.giveBack(l.borrowed)
	l.borrowed = 0
}
