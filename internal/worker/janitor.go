package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/objstore"
)

// PruneCheckpoints deletes local checkpoints of tiles that are promoted: a tile this node
// started but another node finished (from the remote checkpoint) would otherwise leave its
// local checkpoint behind for good. A checkpoint written before checkpoints named their frame
// (format version 3) cannot be matched with its manifest and is left alone. It runs now and
// then every interval until ctx is done.
func PruneCheckpoints(ctx context.Context, ckpts *checkpoint.Local, objects objstore.Store, interval time.Duration, log *slog.Logger) {
	for {
		keys, err := ckpts.List(ctx)
		if err != nil && ctx.Err() == nil {
			log.Warn("listing local checkpoints", "err", err)
		}
		pruned := 0
		for _, k := range keys {
			c, ok, err := ckpts.Load(ctx, k)
			if err != nil || !ok || c.FrameKey == "" {
				continue
			}
			done, err := finalize.ManifestExists(ctx, objects, layout.TileManifestKey(c.FrameKey, k))
			if err != nil || !done {
				continue
			}
			if err := ckpts.Delete(ctx, k); err == nil {
				pruned++
			}
		}
		if pruned > 0 {
			log.Info("pruned checkpoints of tiles finished elsewhere", "count", pruned)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
