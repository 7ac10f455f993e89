package finalize

import (
	"context"
	"errors"
	"fmt"
	"github.com/tilefarm/tilefarm/objstore"
	"strings"
	"time"
)

// GCReport says what CollectGarbage did.
type GCReport struct {
	Deleted    []string // keys deleted
	Referenced []string // candidates kept because a manifest names them
	Protected  []string // candidates kept because keep() asked to
	Young      []string // candidates kept because they are younger than the grace period
	Manifests  int      // manifests read
}

// CollectGarbage deletes objects under prefixes (e.g. "attempts/",
// "checkpoints/") that no manifest references, that keep does not protect,
// and whose ModTime is more than grace before now. It never deletes anything a
// manifest names and refuses prefixes that cover the manifests themselves.
//
// Candidates are listed before the manifests, so a manifest promoted while the
// collector runs is still seen. The grace period must exceed the longest time
// between an attempt's upload and its manifest creation: an in-flight
// promotion's objects are young and therefore kept. A manifest that cannot be
// parsed aborts the collection before anything is deleted.
func CollectGarbage(ctx context.Context, s objstore.Store, prefixes []string, grace time.Duration, now time.Time, keep func(key string) bool) (GCReport, error) {
	var report GCReport
	if grace < 0 {
		return report, fmt.Errorf("collecting garbage: negative grace period %s", grace)
	}
	var candidates []objstore.ObjectInfo
	seen := make(map[string]bool)
	for _, p := range prefixes {
		if p == "" || strings.HasPrefix(ManifestPrefix, p) || strings.HasPrefix(p, ManifestPrefix) {
			return report, fmt.Errorf("collecting garbage: prefix %q would cover %q", p, ManifestPrefix)
		}
		objs, err := s.List(ctx, p)
		if err != nil {
			return report, fmt.Errorf("collecting garbage: %w", err)
		}
		for _, o := range objs {
			if !seen[o.Key] {
				seen[o.Key] = true
				candidates = append(candidates, o)
			}
		}
	}

	referenced, n, err := referencedKeys(ctx, s)
	if err != nil {
		return report, fmt.Errorf("collecting garbage: %w", err)
	}
	report.Manifests = n

	cutoff := now.Add(-grace)
	for _, o := range candidates {
		switch {
		case referenced[o.Key]:
			report.Referenced = append(report.Referenced, o.Key)
		case keep != nil && keep(o.Key):
			report.Protected = append(report.Protected, o.Key)
		case !o.ModTime.Before(cutoff):
			report.Young = append(report.Young, o.Key)
		default:
			if err := s.Delete(ctx, o.Key); err != nil {
				return report, fmt.Errorf("collecting garbage: %w", err)
			}
			report.Deleted = append(report.Deleted, o.Key)
		}
	}
	return report, nil
}

// referencedKeys reads every manifest and returns the set of keys they name.
func referencedKeys(ctx context.Context, s objstore.Store) (map[string]bool, int, error) {
	manifests, err := s.List(ctx, ManifestPrefix)
	if err != nil {
		return nil, 0, err
	}
	refs := make(map[string]bool)
	for _, mi := range manifests {
		data, err := s.Get(ctx, mi.Key)
		if errors.Is(err, objstore.ErrNotFound) {
			continue // removed since listing: it references nothing any more
		}
		if err != nil {
			return nil, 0, err
		}
		m, err := parseManifest(data)
		if err != nil {
			return nil, 0, fmt.Errorf("manifest %q: %w", mi.Key, err)
		}
		for _, o := range m.Objects {
			refs[o.Key] = true
		}
	}
	return refs, len(manifests), nil
}
