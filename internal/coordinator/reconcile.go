package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
)

// reconcileLoop reconciles at start and every ReconcileEvery.
func (c *Coordinator) reconcileLoop(ctx context.Context) error {
	t := time.NewTicker(c.cfg.ReconcileEvery)
	defer t.Stop()
	for {
		if _, err := c.Reconcile(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("reconciling with manifests", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ReconcileReport says what one reconciliation found.
type ReconcileReport struct {
	Frames       int // unfinished frames compared with the store
	Tiles        int // tiles found promoted that the projection did not know of
	Outputs      int // frame outputs found promoted that the projection did not know of
	Reassembled  int // frames whose assembly was asked for again
	Redispatched int // tiles dispatched again because nothing held their messages (lost.go)
}

// Reconcile compares every unfinished frame with its manifests: a promoted tile is completed
// whatever the events said, a frame whose tiles are all promoted gets its assembly (flush asks
// for it), a promoted output completes its format, and tiles nothing can deliver any more are
// dispatched again (redispatchLost, lost.go). It costs one listing of a frame's tile
// manifests per unfinished frame, plus one of its outputs once its tiles are done: it grows
// with unfinished frames, never with every tile ever rendered.
func (c *Coordinator) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	var open []string
	if err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		tx.OpenFrames(func(fk string) bool {
			open = append(open, fk)
			return true
		})
		return nil
	}); err != nil {
		return rep, err
	}
	for _, fk := range open {
		if err := c.reconcileFrame(ctx, fk, &rep); err != nil {
			return rep, fmt.Errorf("frame %s: %w", fk, err)
		}
		rep.Frames++
	}
	if rep.Tiles+rep.Outputs+rep.Reassembled > 0 {
		c.log.Info("reconciled with manifests", "frames", rep.Frames, "tiles_found", rep.Tiles,
			"outputs_found", rep.Outputs, "reassembled", rep.Reassembled)
	}
	n, err := c.redispatchLost(ctx)
	rep.Redispatched = n
	if err != nil {
		return rep, fmt.Errorf("looking for lost tiles: %w", err)
	}
	return rep, nil
}

func (c *Coordinator) reconcileFrame(ctx context.Context, fk string, rep *ReconcileReport) error {
	var f *coorddb.Frame
	var table coorddb.TileTable
	if err := c.db.View(ctx, func(tx *coorddb.Tx) (err error) {
		if f, err = tx.Frame(fk); err != nil {
			return err
		}
		table, err = tx.TileTable(f)
		return err
	}); err != nil {
		return ignoreUnknown(err)
	}
	if f.Held {
		// Never dispatched: nothing of it can be promoted (docs/design.md, "Jobs that wait
		// for jobs").
		return nil
	}
	var tilesDone []int
	if f.TilesCompleted < f.TilesTotal {
		promoted, err := c.listed(ctx, layout.TileManifestPrefix(fk))
		if err != nil {
			return err
		}
		ft, err := f.Tiles()
		if err != nil {
			return err
		}
		for i, t := range ft {
			if s, _ := table.Get(i); s != coorddb.TileCompleted && promoted[t.Key] {
				tilesDone = append(tilesDone, i)
			}
		}
	}
	var outputs []string
	stale := false
	if f.TilesCompleted+len(tilesDone) == f.TilesTotal {
		promoted, err := c.listed(ctx, layout.FrameManifestPrefix(fk))
		if err != nil {
			return err
		}
		for _, fm := range f.Formats {
			if promoted[fm] && !slices.Contains(f.Done, fm) {
				outputs = append(outputs, fm)
			}
		}
		stale = len(tilesDone) == 0 && f.State == coorddb.FrameAssembling && c.now().Sub(f.Updated) > c.cfg.StaleAssembly &&
			!coorddb.HasAll(append(outputs, f.Done...), f.Formats)
	}
	if len(tilesDone) == 0 && len(outputs) == 0 && !stale {
		return nil
	}
	rep.Tiles += len(tilesDone)
	rep.Outputs += len(outputs)
	if stale {
		rep.Reassembled++
	}
	return c.update(ctx, func(p *projection) error {
		for _, i := range tilesDone {
			if _, err := p.tile(fk, tileUpdate{Index: i, Change: coorddb.TileDone}); err != nil {
				return err
			}
		}
		if len(outputs) > 0 {
			if err := p.formatsDone(fk, outputs); err != nil {
				return err
			}
		}
		if stale {
			c.log.Warn("assembly waited too long; asking for it again", "frame_key", fk)
			return p.staleAssembly(fk)
		}
		return nil
	})
}

// listed returns the last key segment (without ".json") of every manifest under a logical
// prefix: the tile keys or formats promoted there.
func (c *Coordinator) listed(ctx context.Context, prefix string) (map[string]bool, error) {
	full := finalize.ManifestPrefix + prefix
	objs, err := c.objects.List(ctx, full)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", full, err)
	}
	out := make(map[string]bool, len(objs))
	for _, o := range objs {
		name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, full), ".json")
		if ok && !strings.Contains(name, "/") {
			out[name] = true
		}
	}
	return out, nil
}
