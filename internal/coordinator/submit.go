// Package coordinator turns submissions into tile jobs and keeps the authoritative view of
// where every job, frame and tile stands. Submissions are written with their outbox records in
// one bbolt transaction; a relay publishes the outbox; an idempotent event consumer and the
// dead-letter watcher keep the projection current.
package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/store"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// Limits on a submission, so a typo cannot enqueue a million frames.
const (
	MaxFramesPerJob = 100000
	MaxTilesPerJob  = 2000000
)

// ErrBadInput marks a submission that can never succeed as given (exit code 1).
var ErrBadInput = errors.New("bad input")

// ErrConflict is returned when an idempotency key is reused with a different payload.
var ErrConflict = errors.New("idempotency conflict")

// SubmitRequest is what a client sends to submit a job.
type SubmitRequest struct {
	Bundle         *farm.Bundle `json:"bundle"`
	Project        string       `json:"project,omitempty"`
	Camera         string       `json:"camera,omitempty"`
	First          int          `json:"first"`
	Last           int          `json:"last"`
	SPP            int          `json:"spp,omitempty"`
	Width          int          `json:"width,omitempty"`
	Height         int          `json:"height,omitempty"`
	TileSize       int          `json:"tile_size,omitempty"`
	Priority       int          `json:"priority,omitempty"`
	Formats        []string     `json:"formats,omitempty"`
	IdempotencyKey string       `json:"idempotency_key,omitempty"`
}

// SubmitResult says which job holds the request and whether this call created it.
type SubmitResult struct {
	Status  Status `json:"status"`
	Created bool   `json:"created"`
}

// canonicalPayload is what payload_hash covers: everything that decides the job's outputs.
// Tile size and priority are scheduling hints and are left out, so resubmitting with another
// tile size returns the same job instead of a conflict.
type canonicalPayload struct {
	Project      string   `json:"project"`
	SceneVersion string   `json:"scene_version"`
	Camera       string   `json:"camera"`
	First        int      `json:"first"`
	Last         int      `json:"last"`
	SettingsHash string   `json:"settings_hash"`
	Formats      []string `json:"formats"`
}

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}

// plan resolves a request into settings and keys without touching any state.
type plan struct {
	job    store.Job
	scene  *render.Scene
	rects  []render.Rect
	bundle []byte
}

func (c *Coordinator) planSubmission(req SubmitRequest) (*plan, error) {
	if req.Bundle == nil || len(req.Bundle.Scene) == 0 {
		return nil, badInput("no scene in the submission")
	}
	scene, err := req.Bundle.Parse()
	if err != nil {
		return nil, badInput("%v", err)
	}
	st := scene.Defaults()
	if req.Camera != "" {
		st.Camera = req.Camera
	}
	if req.SPP != 0 {
		st.SPP = req.SPP
	}
	if req.Width != 0 {
		st.Width = req.Width
	}
	if req.Height != 0 {
		st.Height = req.Height
	}
	if err := scene.Validate(st); err != nil {
		return nil, badInput("%v", err)
	}
	first, last := req.First, req.Last
	if first == 0 && last == 0 {
		first, last = scene.Frames()
	}
	if last < first {
		return nil, badInput("frame range %d-%d is reversed", first, last)
	}
	if last-first+1 > MaxFramesPerJob {
		return nil, badInput("frame range %d-%d has more than %d frames", first, last, MaxFramesPerJob)
	}
	size := req.TileSize
	if size == 0 {
		size = 64
	}
	rects, err := tiles.Split(st.Width, st.Height, size)
	if err != nil {
		return nil, badInput("tile size: %v", err)
	}
	if len(rects)*(last-first+1) > MaxTilesPerJob {
		return nil, badInput("%d frames of %d tiles exceed %d tiles per job", last-first+1, len(rects), MaxTilesPerJob)
	}
	formats, err := farm.NormalizeFormats(req.Formats)
	if err != nil {
		return nil, badInput("%v", err)
	}
	bundle, err := req.Bundle.Encode()
	if err != nil {
		return nil, badInput("encoding scene bundle: %v", err)
	}
	sv := req.Bundle.Version()
	sh := tiles.SettingsHash(st)
	payload, _ := json.Marshal(canonicalPayload{Project: req.Project, SceneVersion: sv, Camera: st.Camera,
		First: first, Last: last, SettingsHash: sh, Formats: formats})
	key := req.IdempotencyKey
	if key == "" {
		key = tiles.DerivedIdempotencyKey(req.Project, sv, st.Camera, first, last, sh, formats)
	}
	j := store.Job{
		ID: tiles.JobID(key), IdempotencyKey: key, PayloadHash: tiles.PayloadHash(payload), Project: req.Project,
		SceneVersion: sv, SceneName: req.Bundle.Name, Camera: st.Camera, First: first, Last: last, Settings: st,
		TileSize: size, Priority: req.Priority, Formats: formats, Created: c.now(),
	}
	for f := first; f <= last; f++ {
		j.FrameKeys = append(j.FrameKeys, tiles.FrameKey(sv, st.Camera, f, sh))
	}
	return &plan{job: j, scene: scene, rects: rects, bundle: bundle}, nil
}

// Submit records a job, its frames, tiles and outbox records in one transaction. The same
// idempotency key with the same payload returns the existing job; with another payload it is a
// conflict. Frames already known (completed by an earlier job, or in progress) are shared.
func (c *Coordinator) Submit(ctx context.Context, req SubmitRequest) (SubmitResult, error) {
	p, err := c.planSubmission(req)
	if err != nil {
		return SubmitResult{}, err
	}
	if c.backpressure(ctx) {
		return SubmitResult{}, ErrBusy
	}
	// The scene is stored before the transaction that makes tiles visible to workers.
	if err := c.putScene(ctx, p.job.SceneVersion, p.bundle); err != nil {
		return SubmitResult{}, err
	}
	created := false
	err = c.store.Update(ctx, func(tx *store.Tx) error {
		if old, err := tx.JobByIdempotencyKey(p.job.IdempotencyKey); err == nil {
			if old.PayloadHash != p.job.PayloadHash {
				return fmt.Errorf("%w: idempotency key %q already names job %s with a different request", ErrConflict, p.job.IdempotencyKey, old.ID)
			}
			p.job = *old
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		created = true
		now := c.now()
		for i, fk := range p.job.FrameKeys {
			f, err := tx.Frame(fk)
			if err == nil {
				if err := c.shareFrame(tx, f, &p.job, now); err != nil {
					return err
				}
				continue
			}
			if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			if err := c.addFrame(tx, &p.job, p.job.First+i, fk, p.rects, now); err != nil {
				return err
			}
		}
		return tx.PutJob(&p.job)
	})
	if err != nil {
		return SubmitResult{}, err
	}
	c.kickRelay()
	st, err := c.Status(ctx, p.job.ID)
	if err != nil {
		return SubmitResult{}, err
	}
	return SubmitResult{Status: st, Created: created}, nil
}

// shareFrame attaches a job to a frame another job already asked for. Formats the frame does not
// have yet are added; a frame already assembled is assembled again for just those.
func (c *Coordinator) shareFrame(tx *store.Tx, f *store.Frame, j *store.Job, now time.Time) error {
	f.JobIDs = append(f.JobIDs, j.ID)
	union, _ := farm.NormalizeFormats(append(slices.Clone(f.Formats), j.Formats...))
	if !slices.Equal(union, f.Formats) {
		f.Formats = union
		if f.State == store.FrameCompleted {
			f.Move(store.FrameAssembling, "", now)
			if err := c.enqueueAssemble(tx, f, "formats"); err != nil {
				return err
			}
		}
	}
	return tx.PutFrame(f)
}

func (c *Coordinator) addFrame(tx *store.Tx, j *store.Job, frame int, fk string, rects []render.Rect, now time.Time) error {
	f := &store.Frame{Key: fk, Frame: frame, SceneVersion: j.SceneVersion, Settings: j.Settings,
		Formats: j.Formats, JobIDs: []string{j.ID}, TileSize: j.TileSize, TilesTotal: len(rects)}
	f.Move(store.FrameQueued, "", now)
	for _, r := range rects {
		tk := tiles.TileKey(fk, r)
		t := &store.Tile{Key: tk, FrameKey: fk, Rect: r}
		t.Move(store.TileQueued, "", "", "", now)
		if err := tx.PutTile(t); err != nil {
			return err
		}
		data, err := json.Marshal(farm.TileJob{JobID: j.ID, TileKey: tk, FrameKey: fk, SceneVersion: j.SceneVersion,
			Settings: j.Settings, Frame: frame, Rect: r, InputHash: tiles.InputHash(j.SceneVersion, j.Settings, frame, r)})
		if err != nil {
			return err
		}
		if err := tx.AddOutbox(queue.SubjectRender, tk, data); err != nil {
			return err
		}
	}
	return tx.PutFrame(f)
}

func (c *Coordinator) putScene(ctx context.Context, version string, bundle []byte) error {
	key := farm.SceneKey(version)
	if _, err := c.objects.Stat(ctx, key); err == nil {
		return nil
	} else if !errors.Is(err, finalize.ErrNotFound) {
		return fmt.Errorf("checking stored scene: %w", err)
	}
	if err := c.objects.Put(ctx, key, bundle); err != nil {
		return fmt.Errorf("storing scene %s: %w", version, err)
	}
	return nil
}
