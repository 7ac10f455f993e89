package coordinator

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Each completed tile's render time, as its worker reported it, is kept in the frame's one
// record of the times bucket and served with the frame's tiles; the frame's sum is in status.
// A repeated completion changes nothing, and a completion taken back forgets its time.
func TestRenderTimesAreKeptPerFrame(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 64, 64, 32) // 4 tiles
	job := res.Status.JobID
	h.completeTiles(t, fk) // tiles report 100, 200, 300 and 400 ms
	ft, err := h.c.FrameTiles(h.ctx, job, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, ti := range ft.Tiles {
		if ti.RenderMillis != uint32(100*(i+1)) {
			t.Fatalf("tile %d render_ms = %d, want %d", i, ti.RenderMillis, 100*(i+1))
		}
	}
	if got := h.status(t, job).Frames[0].RenderSeconds; got != 1.0 {
		t.Fatalf("frame render_seconds = %v, want 1.0 (the tiles' sum)", got)
	}
	counts, err := h.st.Counts(h.ctx)
	if err != nil || counts["times"] != 1 {
		t.Fatalf("times bucket holds %d records (%v), want one for the frame", counts["times"], err)
	}

	// A second completion of tile 2 (a duplicate's) keeps the first report.
	f := h.frame(t, fk)
	again := tileEvent(t, f, 2, wire.EventTileCompleted, 9, 1)
	again.RenderMillis = 9000
	h.apply(t, again)
	if got := h.status(t, job).Frames[0].RenderSeconds; got != 1.0 {
		t.Fatalf("render_seconds after a repeated completion = %v, want still 1.0", got)
	}
	// Tile 3's completion is taken back (its manifest not found): its time goes with it.
	if err := h.c.update(h.ctx, func(p *projection) error {
		_, err := p.tile(fk, tileUpdate{Index: 3, Change: coorddb.TileUnproven})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ft, _ = h.c.FrameTiles(h.ctx, job, 1)
	if ft.Tiles[3].RenderMillis != 0 || ft.Tiles[3].State != api.TileQueued || ft.Tiles[2].RenderMillis != 300 {
		t.Fatalf("after tile 3's completion was taken back: %+v", ft.Tiles)
	}
	if got := h.status(t, job).Frames[0].RenderSeconds; got != 0.6 {
		t.Fatalf("render_seconds after tile 3 was taken back = %v, want 0.6", got)
	}
}

// A tile's failed attempts are served with the lines their workers logged, counted in the
// frame's tiles, and a dead letter's page names its tile and carries the same attempts.
func TestFailedAttemptsAreServedWithTheirLogs(t *testing.T) {
	h := newHarness(t, Config{})
	res, fk := h.submitFrame(t, 64, 64, 32)
	job := res.Status.JobID
	f := h.frame(t, fk)
	failed := tileEvent(t, f, 1, wire.EventTileFailed, 1, 1)
	failed.Code, failed.Error = "panic", "panic: injected fault"
	failed.Log = []string{`time=12:00:00.000 level=DEBUG msg="rendering tile" tile=1`, "renderer: Error: out of memory",
		`time=12:00:01.000 level=WARN msg="retrying later" class=panic`}
	dead := tileEvent(t, f, 1, wire.EventTileFailed, 1, 2)
	dead.Code, dead.Error, dead.Terminal = "panic", "failed 2 times (limit 2): panic: injected fault", true
	dead.Log = []string{`time=12:00:02.000 level=ERROR msg=dead-lettering class=panic`}
	h.apply(t, failed, dead)

	ft, err := h.c.FrameTiles(h.ctx, job, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ft.Tiles[1].Failures != 2 || ft.Tiles[0].Failures != 0 {
		t.Fatalf("failure counts of tiles 0 and 1 = %d, %d; want 0, 2", ft.Tiles[0].Failures, ft.Tiles[1].Failures)
	}
	tf, err := h.c.TileFailures(h.ctx, job, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(tf.Failures) != 2 || tf.State != api.TileDeadLettered || tf.TileKey != ft.Tiles[1].TileKey {
		t.Fatalf("tile failures = %+v, want two attempts of the dead-lettered tile", tf)
	}
	first, last := tf.Failures[0], tf.Failures[1]
	if first.Class != "panic" || first.Worker != "w1" || first.DeadLettered || !slices.Equal(first.Log, failed.Log) {
		t.Fatalf("first failed attempt = %+v, want the retried one with its log", first)
	}
	if !last.DeadLettered || !strings.Contains(last.Log[0], "dead-lettering") {
		t.Fatalf("last failed attempt = %+v, want the dead-lettering one", last)
	}
	if _, err := h.c.TileFailures(h.ctx, job, 1, 4); !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("failures of tile 4 of a 4-tile frame: %v, want bad input", err)
	}
	if none, err := h.c.TileFailures(h.ctx, job, 1, 0); err != nil || len(none.Failures) != 0 || none.Failures == nil {
		t.Fatalf("failures of a tile that never failed = %+v, %v; want an empty list", none, err)
	}
}
