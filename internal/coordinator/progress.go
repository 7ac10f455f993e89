package coordinator

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
)

// Tile progress (docs/design.md, "Progress"): workers report the samples of a tile in progress
// after each pass on core NATS; the coordinator keeps the newest report per tile in memory
// only, so a status can count the samples of tiles not completed yet. Nothing here is ever
// written: a report lost, or a coordinator restarted, loses a moment of progress display and
// nothing else.
const (
	// progressTTL is how long a report counts: a tile not reported for longer is forgotten,
	// since its worker died or its completion was missed (the reconciler completes it).
	progressTTL = time.Minute
	// progressEndTTL is how long a finished tile's late reports are ignored: an ended tile is
	// remembered for one to two of it (two generations), less only when the cap is reached.
	progressEndTTL = 2 * time.Minute
	// progressSweepEvery is how often expired reports are dropped.
	progressSweepEvery = 10 * time.Second
	// maxProgressTiles bounds the tiles in progress held, and separately each generation of
	// ended tiles: a few MiB at most, whatever workers send.
	maxProgressTiles = 100_000
)

// tileID is a tile key decoded: half the memory of its hex.
type tileID [32]byte

// tileProgress is the newest report of one tile.
type tileProgress struct {
	samples int
	seen    time.Time // by the coordinator's clock: workers' clocks may disagree with it
}

// tileEnd is a tile whose attempt ended, so that a report arriving after the event that said
// so cannot bring it back.
type tileEnd struct {
	completed bool      // completed is final: every later report is late
	worker    string    // failed: the worker whose attempt failed
	at        time.Time // failed: when, by that worker's clock
}

// late reports whether r was sent before the end e: every report of a completed tile, and the
// failed worker's reports up to its failure (a retry, on any worker, reports after it).
func (e tileEnd) late(r *wire.Progress) bool {
	return e.completed || (r.Worker == e.worker && !r.Time.After(e.at))
}

// progressTracker holds the tiles in progress by frame key. Its methods are safe for
// concurrent use: reports arrive on the subscription's goroutine, ends on the event
// consumer's, and statuses are asked for by HTTP handlers.
type progressTracker struct {
	now func() time.Time
	log *slog.Logger
	max int // tiles in progress held, and ended tiles per generation

	mu        sync.Mutex
	frames    map[string]map[tileID]tileProgress
	tiles     int // entries in frames
	lastSweep time.Time
	// ended and endedOld are two generations of ended tiles: a lookup asks both, and ended
	// replaces endedOld every progressEndTTL (or when it is full), which bounds them without
	// a timestamp per tile.
	ended, endedOld map[tileID]tileEnd
	endedSince      time.Time
}

func newProgressTracker(now func() time.Time, log *slog.Logger) *progressTracker {
	return &progressTracker{now: now, log: log, max: maxProgressTiles,
		frames: map[string]map[tileID]tileProgress{}, ended: map[tileID]tileEnd{}, endedOld: map[tileID]tileEnd{}}
}

// decodeTile decodes a tile key, which must be lowercase sha256 hex.
func decodeTile(key string) (tileID, bool) {
	var id tileID
	if !validHash(key) {
		return id, false
	}
	_, err := hex.Decode(id[:], []byte(key))
	return id, err == nil
}

// receive records one report. What is not a well-formed report is ignored: progress is
// advisory and must never cost the coordinator more than the bounded map it fills.
func (t *progressTracker) receive(data []byte) {
	var r wire.Progress
	if err := json.Unmarshal(data, &r); err != nil {
		t.log.Debug("ignoring an undecodable progress report", "err", err)
		return
	}
	id, ok := decodeTile(r.TileKey)
	if !ok || !validHash(r.FrameKey) || r.SPP < 1 || r.SPP > render.MaxSPP || r.Samples < 0 || r.Samples > r.SPP {
		t.log.Debug("ignoring a malformed progress report", "frame_key", r.FrameKey, "tile_key", r.TileKey, "samples", r.Samples, "spp", r.SPP)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.rotate(now, false)
	if e, ok := t.end(id); ok && e.late(&r) {
		return
	}
	tiles := t.frames[r.FrameKey]
	if _, ok := tiles[id]; !ok {
		if t.tiles >= t.max && now.Sub(t.lastSweep) >= time.Second {
			t.sweep(now)
			tiles = t.frames[r.FrameKey] // the sweep may have dropped the frame's map
		}
		if t.tiles >= t.max {
			t.log.Debug("ignoring a progress report: too many tiles in progress", "tiles", t.tiles)
			return
		}
		if tiles == nil {
			tiles = map[tileID]tileProgress{}
			t.frames[r.FrameKey] = tiles
		}
		t.tiles++
	}
	tiles[id] = tileProgress{samples: r.Samples, seen: now}
}

// end looks a tile up among the ended ones.
func (t *progressTracker) end(id tileID) (tileEnd, bool) {
	if e, ok := t.ended[id]; ok {
		return e, true
	}
	e, ok := t.endedOld[id]
	return e, ok
}

// rotate starts a new generation of ended tiles when the current one is old enough, or full
// (force), dropping the previous one.
func (t *progressTracker) rotate(now time.Time, force bool) {
	if force || now.Sub(t.endedSince) >= progressEndTTL {
		t.endedOld, t.ended, t.endedSince = t.ended, map[tileID]tileEnd{}, now
	}
}

// finished forgets the tiles that the applied events completed or failed. A tile of a frame
// with tiles in progress is remembered as ended for a while, so a report that crossed its
// event on the way is not counted again; frames of short tiles, which report nothing, cost a
// map lookup per event.
func (t *progressTracker) finished(evs []wire.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.rotate(now, false)
	for i := range evs {
		ev := &evs[i]
		if ev.Type != wire.EventTileCompleted && ev.Type != wire.EventTileFailed {
			continue
		}
		tiles, ok := t.frames[ev.FrameKey]
		if !ok {
			continue
		}
		id, ok := decodeTile(ev.TileKey)
		if !ok {
			continue
		}
		if _, ok := tiles[id]; ok {
			delete(tiles, id)
			t.tiles--
			if len(tiles) == 0 {
				delete(t.frames, ev.FrameKey)
			}
		}
		e := tileEnd{completed: true}
		if ev.Type == wire.EventTileFailed {
			if old, ok := t.end(id); ok && old.completed {
				continue
			}
			e = tileEnd{worker: ev.Worker, at: ev.Time}
		}
		if len(t.ended) >= t.max {
			t.rotate(now, true)
		}
		t.ended[id] = e
	}
}

// sweep drops the reports older than progressTTL. The caller holds t.mu.
func (t *progressTracker) sweep(now time.Time) {
	t.lastSweep = now
	for fk, tiles := range t.frames {
		for id, p := range tiles {
			if now.Sub(p.seen) >= progressTTL {
				delete(tiles, id)
				t.tiles--
			}
		}
		if len(tiles) == 0 {
			delete(t.frames, fk)
		}
	}
}

// samples returns the samples reported of the tiles in progress, per frame key that has any.
// It costs the tiles in progress, not the frames asked about.
func (t *progressTracker) samples() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	out := make(map[string]int64, len(t.frames))
	for fk, tiles := range t.frames {
		var n int64
		for _, p := range tiles {
			if now.Sub(p.seen) < progressTTL {
				n += int64(p.samples)
			}
		}
		if n > 0 {
			out[fk] = n
		}
	}
	return out
}

// len returns the tiles in progress held, expired ones included until the next sweep.
func (t *progressTracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tiles
}

// watchProgress receives progress reports until ctx is done, then drains the subscription.
// A core NATS subscription survives reconnects by itself; the loop only sweeps.
func (c *Coordinator) watchProgress(ctx context.Context) error {
	sub, err := c.queue.SubscribeProgress(c.progress.receive)
	if err != nil {
		return fmt.Errorf("subscribing to tile progress: %w", err)
	}
	defer func() { _ = sub.Drain() }()
	tick := time.NewTicker(progressSweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			c.progress.mu.Lock()
			c.progress.sweep(c.progress.now())
			c.progress.mu.Unlock()
		}
	}
}
