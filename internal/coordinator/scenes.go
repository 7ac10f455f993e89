package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/content"
	"github.com/tilefarm/tilefarm/internal/coorddb"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/flight"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/objstore"
)

// ErrSceneMissing is returned for a submission naming a scene that was never uploaded.
var ErrSceneMissing = errors.New("scene not uploaded")

// sceneInfo is what a submission needs of a stored scene: its name, its kind, and what its
// document says about settings, cameras and frames. It is small: assets are never kept.
type sceneInfo struct {
	name string
	kind scene.Kind
	info scene.Description
}

// HasScene reports whether a scene's manifest is stored under version.
func (c *Coordinator) HasScene(ctx context.Context, version string) (bool, error) {
	if !validHash(version) {
		return false, badInput("scene version %q is not a sha256 hex digest", version)
	}
	_, err := c.objects.Stat(ctx, layout.SceneKey(version))
	if errors.Is(err, objstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking stored scene: %w", err)
	}
	return true, nil
}

// maxMissingAsked bounds the hashes one MissingContent call asks about; a client asks in
// batches (api.MaxContentAsked).
const maxMissingAsked = api.MaxContentAsked

// storeParallel is how many store requests a scene's check makes at once.
const storeParallel = 16

// MissingContent returns which of refs the store lacks (by hash, with that size): what a
// submission must upload before its manifest. Each file is stored once under its hash, so a
// file any earlier job sent is never sent again.
func (c *Coordinator) MissingContent(ctx context.Context, refs []api.ContentRef) ([]api.ContentRef, error) {
	if len(refs) > maxMissingAsked {
		return nil, badInput("%d hashes in one request; ask about at most %d at a time", len(refs), maxMissingAsked)
	}
	for _, r := range refs {
		if !validHash(r.SHA256) || r.Size < 0 {
			return nil, badInput("content %q of size %d: want a sha256 hex digest and a size >= 0", r.SHA256, r.Size)
		}
	}
	have := make([]bool, len(refs))
	err := flight.Each(ctx, len(refs), storeParallel, func(ctx context.Context, i int) error {
		ok, err := c.hasContent(ctx, refs[i].SHA256, refs[i].Size)
		have[i] = ok
		return err
	})
	if err != nil {
		return nil, err
	}
	var missing []api.ContentRef
	for i, r := range refs {
		if !have[i] {
			missing = append(missing, r)
		}
	}
	return missing, nil
}

// hasContent reports whether the file of hash sha is stored, with size bytes.
func (c *Coordinator) hasContent(ctx context.Context, sha string, size int64) (bool, error) {
	info, err := c.objects.Stat(ctx, layout.ContentKey(sha))
	if errors.Is(err, objstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking stored content %s: %w", sha, err)
	}
	return info.Size == size, nil
}

// PutContent stores one file of a scene under its hash, streaming it from r to the store as it
// arrives: nothing of it is held in memory, and it is stored only if its bytes hash to ref
// (content.VerifyingReader fails the upload's last read otherwise), so no object under a hash
// ever holds other bytes. Storing content the store has already is harmless: the same bytes.
func (c *Coordinator) PutContent(ctx context.Context, ref api.ContentRef, r io.Reader) error {
	if !validHash(ref.SHA256) || ref.Size < 0 {
		return badInput("content %q of size %d: want a sha256 hex digest and a size >= 0", ref.SHA256, ref.Size)
	}
	if c.limits.Bytes > 0 && ref.Size > c.limits.Bytes {
		return badInput("a file of %d bytes exceeds this farm's limit of %d (coordinator serve --max-scene-bytes)", ref.Size, c.limits.Bytes)
	}
	err := c.objects.PutStream(ctx, layout.ContentKey(ref.SHA256), content.VerifyingReader(r, content.Ref{SHA256: ref.SHA256, Size: ref.Size}), ref.Size)
	if errors.Is(err, content.ErrMismatch) {
		return badInput("the upload of %s: %v", ref.SHA256, err)
	}
	if err != nil {
		return fmt.Errorf("storing content %s: %w", ref.SHA256, err)
	}
	c.uploaded.Put(ref.SHA256, uploadedContent{size: ref.Size, at: c.now()})
	return nil
}

// uploadedContent is a file PutContent stored, and when.
type uploadedContent struct {
	size int64
	at   time.Time
}

// freshUpload is how long a file PutContent stored is taken as present without asking the
// store: far within the hour `coordinator gc` leaves any object alone (its minimum grace), so
// the manifest that names it next is checked with one store request less per new file.
const freshUpload = 10 * time.Minute

// maxFreshUploads bounds the uploads remembered (a few hundred bytes each).
const maxFreshUploads = 100_000

// stored reports whether the file of hash sha is stored with size bytes: uploaded here moments
// ago, or as the store says.
func (c *Coordinator) stored(ctx context.Context, sha string, size int64) (bool, error) {
	if u, ok := c.uploaded.Peek(sha); ok && u.size == size && c.now().Sub(u.at) < freshUpload {
		return true, nil
	}
	return c.hasContent(ctx, sha, size)
}

// PutScene validates a scene's encoded manifest and stores it, once, under its scene version.
// A manifest that does not hash to version, names a file the store lacks (uploaded with
// PutContent first; a file on the studio's share is not uploaded), of no kind this coordinator
// knows, naming files its scene does not reference, or whose scene does not parse, is bad
// input (scene.Kinds.Check); nothing is stored then.
func (c *Coordinator) PutScene(ctx context.Context, version string, raw []byte) error {
	// Scene gc waits while a manifest is checked and stored: nothing it names is collected
	// between the check and the store (CollectScenes).
	c.sceneGC.RLock()
	defer c.sceneGC.RUnlock()
	if !validHash(version) {
		return badInput("scene version %q is not a sha256 hex digest", version)
	}
	b, err := bundle.Decode(raw, c.limits)
	if err != nil {
		return badInput("%v", err)
	}
	if got := b.Version(); got != version {
		return badInput("scene manifest hashes to %s, not %s", got, version)
	}
	if ok, err := c.HasScene(ctx, version); err != nil {
		return err
	} else if ok {
		if _, err := c.scene(ctx, version); err != nil && !errors.Is(err, ErrSceneMissing) {
			return err
		}
		return nil
	}
	names := b.Names()
	var missing []string
	var mu sync.Mutex
	err = flight.Each(ctx, len(names), storeParallel, func(ctx context.Context, i int) error {
		f := b.Files[names[i]]
		if f.Shared != "" {
			return nil
		}
		ok, err := c.stored(ctx, f.SHA256, f.Size)
		if err == nil && !ok {
			mu.Lock()
			missing = append(missing, names[i])
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return badInput("the scene names %d files the farm does not have (upload them first, PUT /v1/content/{sha256}): %s", len(missing), strings.Join(missing[:min(len(missing), 5)], ", "))
	}
	src := &storeSource{objects: c.objects}
	kind, info, err := c.kinds.Check(ctx, b.WithSource(src))
	if err != nil && src.failed != nil {
		return fmt.Errorf("checking scene %s: reading its files: %w", version, src.failed) // the store's, retried
	}
	if err != nil {
		return badInput("%v", err)
	}
	if err := c.objects.Put(ctx, layout.SceneKey(version), raw); err != nil {
		return fmt.Errorf("storing scene %s: %w", version, err)
	}
	c.scenes.Put(version, &sceneInfo{name: b.Name, kind: kind, info: info})
	return nil
}

// storeSource is a Source of a scene's files in the object store. A file on the studio's share
// is not there: the coordinator does not read it (a kind's check of it says so). It keeps the
// first failure of the store itself, so a check that failed for it is not the scene's fault.
type storeSource struct {
	objects objstore.Store
	failed  error
}

func (s *storeSource) Open(ctx context.Context, name string, f bundle.File) (io.ReadCloser, error) {
	if f.Shared != "" {
		return nil, fmt.Errorf("%q is on the studio's share, which the coordinator does not read: %w", name, bundle.ErrMissing)
	}
	r, _, err := s.objects.Open(ctx, layout.ContentKey(f.SHA256))
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("%q (%s): %w", name, f.SHA256, bundle.ErrMissing)
	}
	if err != nil {
		s.fail(err)
		return nil, err
	}
	return &storeReader{ReadCloser: r, s: s}, nil
}

func (s *storeSource) fail(err error) {
	if s.failed == nil {
		s.failed = err
	}
}

// storeReader notes a read of the store that failed.
type storeReader struct {
	io.ReadCloser
	s *storeSource
}

func (r *storeReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		r.s.fail(err)
	}
	return n, err
}

// scene returns what a submission needs of a stored scene.
func (c *Coordinator) scene(ctx context.Context, version string) (*sceneInfo, error) {
	if !validHash(version) {
		return nil, badInput("scene version %q is not a sha256 hex digest", version)
	}
	return c.scenes.Get(ctx, version, func(ctx context.Context) (*sceneInfo, error) {
		raw, err := c.objects.Get(ctx, layout.SceneKey(version))
		if errors.Is(err, objstore.ErrNotFound) {
			return nil, fmt.Errorf("%w: scene %s: upload it first (PUT /v1/scenes/%s)", ErrSceneMissing, version, version)
		}
		if err != nil {
			return nil, fmt.Errorf("reading stored scene %s: %w", version, err)
		}
		b, err := bundle.Decode(raw, bundle.Limits{Files: math.MaxInt32}) // stored: within the limits it was uploaded under
		if err != nil {
			return nil, fmt.Errorf("stored scene %s: %w", version, err)
		}
		kind, err := c.kinds.ForDocument(b.Scene)
		if err != nil {
			return nil, fmt.Errorf("stored scene %s: %w", version, err)
		}
		info, err := kind.Describe(b.Scene)
		if err != nil {
			return nil, fmt.Errorf("stored scene %s: %w", version, err)
		}
		return &sceneInfo{name: b.Name, kind: kind, info: info}, nil
	})
}

// DefaultSceneGrace is how long a scene no job names is kept by default.
const DefaultSceneGrace = 24 * time.Hour

// sceneGCEvery is how often scene gc looks.
const sceneGCEvery = time.Hour

// sceneGCLoop runs CollectScenes every sceneGCEvery.
func (c *Coordinator) sceneGCLoop(ctx context.Context) error {
	if c.cfg.SceneGrace < 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(sceneGCEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if deleted, err := c.CollectScenes(ctx, c.cfg.SceneGrace); err != nil && ctx.Err() == nil {
			c.log.Warn("collecting scenes no job names", "err", err)
		} else if len(deleted) > 0 {
			c.log.Info("deleted the manifests of scenes no job names", "scenes", len(deleted), "grace", c.cfg.SceneGrace)
		}
	}
}

// CollectScenes deletes the manifests of scenes no job names that are older than grace (a
// scene uploaded for a submission that never came), then the files no stored scene names that
// are older than grace (theirs, and an interrupted upload's). It holds submissions and manifest
// uploads off while it runs (sceneGC), so no job is made for a scene it deletes and no manifest
// is stored naming a file it deletes: a submission after it finds the scene, or a file of it,
// missing and is told so, and the client uploads them again.
func (c *Coordinator) CollectScenes(ctx context.Context, grace time.Duration) ([]string, error) {
	c.sceneGC.Lock()
	defer c.sceneGC.Unlock()
	named := map[string]bool{}
	if err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		jobs, err := tx.Jobs()
		for _, j := range jobs {
			named[j.SceneVersion] = true
		}
		return err
	}); err != nil {
		return nil, err
	}
	// Files first, then the scenes; under the lock no manifest is stored between the two.
	files, err := c.objects.List(ctx, layout.ContentPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing scene files: %w", err)
	}
	stored, err := c.objects.List(ctx, layout.ScenePrefix)
	if err != nil {
		return nil, fmt.Errorf("listing scenes: %w", err)
	}
	cutoff := c.now().Add(-grace)
	var deleted []string
	kept := map[string]bool{} // file hashes the remaining scenes name
	for _, o := range stored {
		version, ok := layout.SceneOfKey(o.Key)
		if !ok {
			continue
		}
		if !named[version] && o.ModTime.Before(cutoff) {
			if err := c.objects.Delete(ctx, o.Key); err != nil {
				return deleted, fmt.Errorf("deleting scene %s: %w", version, err)
			}
			c.scenes.Forget(version)
			deleted = append(deleted, version)
			continue
		}
		raw, err := c.objects.Get(ctx, o.Key)
		if err != nil {
			return deleted, fmt.Errorf("reading scene %s: %w; no file deleted", version, err)
		}
		b, err := bundle.Decode(raw, bundle.Limits{Files: math.MaxInt32})
		if err != nil {
			return deleted, fmt.Errorf("scene %s: %w; no file deleted", version, err)
		}
		for _, f := range b.Files {
			kept[f.SHA256] = true
		}
	}
	for _, o := range files {
		sha, ok := strings.CutPrefix(o.Key, layout.ContentPrefix)
		if !ok || kept[sha] || !o.ModTime.Before(cutoff) {
			continue
		}
		if err := c.objects.Delete(ctx, o.Key); err != nil {
			return deleted, fmt.Errorf("deleting scene file %s: %w", sha, err)
		}
		c.uploaded.Forget(sha)
	}
	return deleted, nil
}

// validJobID reports whether v is a job id as identity.JobID makes them: "job-" and 24
// lowercase hex digits.
func validJobID(v string) bool {
	h, ok := strings.CutPrefix(v, "job-")
	return ok && len(h) == 24 && validHash(h+strings.Repeat("0", 40))
}

// validHash accepts the lowercase sha256 hex of a scene version or a frame key and nothing
// else, so what a client or a worker sends can never be more than a hash inside an object key.
func validHash(v string) bool {
	if len(v) != 64 {
		return false
	}
	for _, c := range v {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
