package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/objstore"
)

// gcPrefixes are where unreferenced objects accumulate: attempt uploads that lost a promotion
// race or whose worker died before promoting, remote checkpoints of finished tiles, and scene
// files whose scene's manifest was never stored (a submit interrupted mid-upload).
var gcPrefixes = []string{"attempts/", layout.CheckpointKey(""), layout.ContentPrefix}

const minGrace = time.Hour

func (p *program) gcCommand() *cobra.Command {
	c := newCommand("gc [--store URL | --data DIR] [--grace D]", "delete unreferenced attempt objects and old checkpoints", `
Delete attempt objects, remote checkpoints and scene files that nothing references and that
are older than --grace. Nothing a manifest names is ever deleted, the checkpoint of a tile not
promoted yet is kept whatever its age (its frame may still render, or be revived by a new job
or a retry, and resume from it), and a scene file is kept while any stored scene names it.
Run it from cron on the coordinator host.`)
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
		named, err := sceneFiles(ctx, objects)
		if err != nil {
			return err
		}
		keep := func(key string) bool { return unfinished(key) || named(key) }
		rep, err := finalize.CollectGarbage(ctx, objects, gcPrefixes, *grace, time.Now(), keep)
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

// sceneFiles returns the keep function of gc for scene files: one is kept while a stored
// scene's manifest names it. Scenes are listed after the files (CollectGarbage lists its
// candidates first), so a scene stored while gc runs keeps its files; one whose manifest cannot
// be read stops the collection before anything is deleted.
func sceneFiles(ctx context.Context, objects objstore.Store) (func(key string) bool, error) {
	scenes, err := objects.List(ctx, layout.ScenePrefix)
	if err != nil {
		return nil, fmt.Errorf("listing scenes: %w", err)
	}
	named := map[string]bool{}
	for _, sc := range scenes {
		raw, err := objects.Get(ctx, sc.Key)
		if errors.Is(err, objstore.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading scene %s: %w", sc.Key, err)
		}
		b, err := bundle.Decode(raw, bundle.Limits{Files: math.MaxInt32})
		if err != nil {
			return nil, fmt.Errorf("scene %s: %w; nothing deleted", sc.Key, err)
		}
		for _, f := range b.Files {
			named[layout.ContentKey(f.SHA256)] = true
		}
	}
	return func(key string) bool { return named[key] }, nil
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
