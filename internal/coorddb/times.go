package coorddb

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// TileTimes holds, for one frame, how long the attempt that completed each tile rendered it,
// in milliseconds, as its worker reported it (wire.Event.RenderMillis): what the monitor's
// heat map draws. Display data, never state: nothing decides anything by it, and a tile
// completed without a report (by the reconciler, by an attempt that found it promoted) is 0,
// unknown (docs/design.md, "Render times"). Layout: u32 little endian per tile, indexed like
// tiles.FrameTiles.
type TileTimes []byte

const timeEntrySize = 4

// NewTileTimes returns the times of a frame of n tiles, every one unknown.
func NewTileTimes(n int) TileTimes { return make(TileTimes, n*timeEntrySize) }

// Len is the number of tiles.
func (t TileTimes) Len() int { return len(t) / timeEntrySize }

// Get returns tile i's render time in milliseconds, 0 if unknown.
func (t TileTimes) Get(i int) uint32 { return binary.LittleEndian.Uint32(t[i*timeEntrySize:]) }

// Set records tile i's render time in milliseconds (0 forgets it).
func (t TileTimes) Set(i int, ms uint32) { binary.LittleEndian.PutUint32(t[i*timeEntrySize:], ms) }

// TileTimes returns the tile times of frame f, all unknown when none was recorded. The
// returned table is the caller's to modify.
func (tx *Tx) TileTimes(f *Frame) (TileTimes, error) {
	raw := tx.tx.Bucket(bucketTimes).Get([]byte(f.Key))
	if raw == nil {
		return NewTileTimes(f.TilesTotal), nil
	}
	if len(raw) != f.TilesTotal*timeEntrySize {
		return nil, fmt.Errorf("frame %s: tile times of %d bytes for %d tiles", f.Key, len(raw), f.TilesTotal)
	}
	return TileTimes(bytes.Clone(raw)), nil
}

// PutTileTimes stores the tile times of a frame.
func (tx *Tx) PutTileTimes(frameKey string, t TileTimes) error {
	return tx.set(bucketTimes, []byte(frameKey), t)
}
