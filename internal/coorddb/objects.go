package coorddb

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// TileObjects holds, for one frame, the object each completed tile was promoted as, as its
// worker reported it (wire.TileObject): what the frame's assembly job names so that the
// assembler reads each tile once (docs/design.md, "Store requests of a tile"). It is a hint,
// never proof: the manifest stays the truth the assembler falls back to. One build is kept
// per frame; a tile reported with another is not kept. Layout: u16 build length | build |
// per tile objectEntrySize bytes (attempt id 8 | sha256 32), all zero where unknown.
type TileObjects []byte

const objectEntrySize = 8 + 32

// NewTileObjects returns the table of a frame of n tiles, every object unknown.
func NewTileObjects(n int) TileObjects { return make(TileObjects, 2+n*objectEntrySize) }

func (t TileObjects) buildLen() int { return int(binary.LittleEndian.Uint16(t)) }

// Build is the build the frame's known objects were promoted by.
func (t TileObjects) Build() string { return string(t[2 : 2+t.buildLen()]) }

func (t TileObjects) entry(i int) []byte {
	off := 2 + t.buildLen() + i*objectEntrySize
	return t[off : off+objectEntrySize]
}

// Len is the number of tiles.
func (t TileObjects) Len() int { return (len(t) - 2 - t.buildLen()) / objectEntrySize }

// Set records tile i's object and returns the table, grown by the build if it had none. An
// attempt or sha256 that is not the hex the farm makes, or a build other than the table's,
// leaves the tile unknown.
func (t TileObjects) Set(i int, attempt, sha256, build string) TileObjects {
	a, errA := hex.DecodeString(attempt)
	s, errS := hex.DecodeString(sha256)
	if i < 0 || i >= t.Len() {
		return t
	}
	if errA != nil || errS != nil || len(a) != 8 || len(s) != 32 || build == "" || len(build) > 0xffff {
		clear(t.entry(i))
		return t
	}
	if t.buildLen() == 0 {
		grown := make(TileObjects, 0, len(t)+len(build))
		grown = binary.LittleEndian.AppendUint16(grown, uint16(len(build)))
		grown = append(append(grown, build...), t[2:]...)
		t = grown
	}
	e := t.entry(i)
	if t.Build() != build {
		clear(e)
		return t
	}
	copy(e, a)
	copy(e[8:], s)
	return t
}

// Get returns tile i's object as "attempt:sha256", or "" when it is not known.
func (t TileObjects) Get(i int) string {
	e := t.entry(i)
	if bytes.Count(e, []byte{0}) == len(e) {
		return ""
	}
	return hex.EncodeToString(e[:8]) + ":" + hex.EncodeToString(e[8:])
}

// Forget makes tile i's object unknown (its completion was taken back).
func (t TileObjects) Forget(i int) { clear(t.entry(i)) }

func (t TileObjects) check(n int) error {
	if len(t) < 2 || len(t) != 2+t.buildLen()+n*objectEntrySize {
		return fmt.Errorf("tile objects of %d bytes for %d tiles", len(t), n)
	}
	return nil
}

// TileObjects returns the tile objects of frame f, all unknown when none was recorded. The
// returned table is the caller's to modify.
func (tx *Tx) TileObjects(f *Frame) (TileObjects, error) {
	raw := tx.tx.Bucket(bucketObjects).Get([]byte(f.Key))
	if raw == nil {
		return NewTileObjects(f.TilesTotal), nil
	}
	t := TileObjects(bytes.Clone(raw))
	if err := t.check(f.TilesTotal); err != nil {
		return nil, fmt.Errorf("frame %s: %w", f.Key, err)
	}
	return t, nil
}

// PutTileObjects stores the tile objects of a frame.
func (tx *Tx) PutTileObjects(frameKey string, t TileObjects) error {
	return tx.set(bucketObjects, []byte(frameKey), t)
}
