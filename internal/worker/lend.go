package worker

import "sync"

// idleSlots counts a worker's tile slots that found no work when they last asked: their
// threads would idle while another slot renders, so a tile starting to render borrows them
// until its render ends (lender). A frame that renders whole (adaptive sampling, a denoiser) is
// one tile: on a worker of two one-thread slots it rendered on one core while the other idled
// (docs/design.md, "Renderers": lent threads). Threads never change a pixel (every Blender line
// and the path tracer write the same bits with any), so lending only changes how fast a tile
// renders. The threads stay the same for all of a tile's passes: Cycles builds its session
// anew when they change, which would throw away the scene a process keeps synced between
// passes (persistent data). Each idle slot is lent to one tile at a time. A slot that takes work
// while its threads are lent starts its tile at once: the node's cores are then oversubscribed
// until the borrowing tile's render ends.
type idleSlots struct {
	mu   sync.Mutex
	idle int // slots idle now
	lent int // of the slots idle when they were borrowed, how many tiles still hold
}

// borrow lends every idle slot no tile holds yet and returns how many (0 for a nil count: a
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

// giveBack returns k slots a tile borrowed.
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

// lender gives a tile the threads of the worker's idle slots on top of its own, from before its
// first pass until after its last. A lender is used by its tile's run alone.
type lender struct {
	tile     threadedTile // nil: a tile that cannot use more threads
	base     int          // the tile's own threads
	idle     *idleSlots
	borrowed int // slots the tile holds now
}

// newLender is the lender of t, which renders on its own threads until it borrows.
func newLender(t any, idle *idleSlots) *lender {
	tt, ok := t.(threadedTile)
	if !ok {
		return &lender{}
	}
	return &lender{tile: tt, base: tt.Threads(), idle: idle}
}

// borrow gives the tile its own threads and those of the idle slots no other tile holds, and
// returns them and whether it borrowed any; giveBack returns the slots.
func (l *lender) borrow() (threads int, lent bool) {
	if l == nil || l.tile == nil {
		return 0, false
	}
	l.giveBack()
	l.borrowed = l.idle.borrow()
	n := l.base * (1 + l.borrowed)
	l.tile.SetThreads(n)
	return n, l.borrowed > 0
}

// giveBack returns the slots the tile borrowed; the tile keeps its threads.
func (l *lender) giveBack() {
	if l == nil {
		return
	}
	l.idle.giveBack(l.borrowed)
	l.borrowed = 0
}
