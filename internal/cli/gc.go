package cli

import (
	"context"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/objstore"
)

// gcPrefixes are where unreferenced objects accumulate: attempt uploads that lost a promotion
// race or whose worker died before promoting, and remote checkpoints of finished tiles. Scene
// files are the coordinator's to collect (Coordinator.CollectScenes): it alone knows which
// scenes jobs name, and it holds uploads off while it does.
var gcPrefixes = []string{"attempts/", layout.CheckpointKey("")}

const minGrace = time.Hour

func (p *program) gcCommand() *cobra.Command {
	c := newCommand("gc [--store URL | --data DIR] [--grace D]", "delete unreferenced attempt objects and old checkpoints", `
Delete attempt objects and remote checkpoints that no manifest references and that are older
than --grace. Nothing a manifest names is ever deleted, and the checkpoint of a tile not
promoted yet is kept whatever its age: its frame may still render, or be revived by a new job
or a retry, and resume from it. Scenes and their files are collected by the coordinator itself
(serve --scene-grace). Run it from cron on the coordinator host.`)
	fs := c.Flags()
	storeURL := fs.String("store", "", "object store URL (default: the filesystem store under --data)")
	data := fs.String("data", ".tilefarm", "coordinator data directory, for the default filesystem store")
	grace := fs.Duration("grace", 24*time.Hour, "only delete objects older than this")
	force := fs.Bool("force", false, "allow a grace period under the 1h minimum (only when no worker is running)")
	p.runErr(c, noArgs, func(ctx context.Context, _ []string, stdout, stderr io.Writer) error {
		if *grace < 0 {
			return usagef("--grace %v: must not be negative", *grace)
		}
		// An attempt object is unreferenced from its upload until its manifest exists; a grace period
		// shorter than a stalled promotion (storage retries, ack-wait x MaxDeliver) could delete it
		// under a manifest about to name it.
		if *grace < minGrace && !*force {
			return usagef("--grace %v is under the %v minimum that protects in-flight promotions; add --force if no worker is running", *grace, minGrace)
		}
		url := *storeURL
		if url == "" {
			url = "file://" + mustAbs(filepath.Join(*data, "store"))
		}
		objects, err := objstore.OpenStore(ctx, url)
		if err != nil {
			return err
		}
		unfinished, err := unpromotedCheckpoints(ctx, objects)
		if err != nil {
			return err
		}
		rep, err := finalize.CollectGarbage(ctx, objects, gcPrefixes, *grace, time.Now(), unfinished)
		if err != nil {
			return err
		}
		if p.jsonOut {
			return writeJSON(stdout, rep)
		}
		fmt.Fprintf(stdout, "deleted %d objects; kept %d referenced, %d younger than %v, %d checkpoints of tiles not promoted; %d manifests checked\n",
			len(rep.Deleted), len(rep.Referenced), len(rep.Young), *grace, len(rep.Protected), rep.Manifests)
		return nil
	})
	return c
}

// unpromotedCheckpoints returns the keep function of gc: a remote checkpoint is kept while its
// tile has no manifest (a frame not finished may render it again, or be revived, and resume
// from it), found by one listing of the tile manifests.
func unpromotedCheckpoints(ctx context.Context, objects objstore.Store) (func(key string) bool, error) {
	manifests, err := objects.List(ctx, finalize.ManifestPrefix+layout.TileManifests)
	if err != nil {
		return nil, fmt.Errorf("listing tile manifests: %w", err)
	}
	promoted := make(map[string]bool, len(manifests))
	for _, m := range manifests {
		promoted[strings.TrimSuffix(path.Base(m.Key), ".json")] = true
	}
	return func(key string) bool {
		tile, ok := strings.CutPrefix(key, layout.CheckpointKey(""))
		return ok && !promoted[tile]
	}, nil
}
