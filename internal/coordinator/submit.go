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
	MaxTilesPerJob  = 500000 // all written in one transaction
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
	SceneFrames    bool         `json:"scene_frames,omitempty"` // render the scene's own frame range; First and Last are ignored
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

// CheckFrameRange rejects reversed, too long and out-of-range frame ranges, without the
// integer overflow a naive last-first+1 has at the extremes.
func CheckFrameRange(first, last int) error {
	switch {
	case last < first:
		return badInput("frame range %d-%d is reversed", first, last)
	case first < 0 || last > render.MaxFrame:
		// Output names give frames as zero-padded numbers; negative ones have no such name.
		return badInput("frame range %d-%d is outside 0-%d", first, last, render.MaxFrame)
	case last-first >= MaxFramesPerJob: // cannot overflow within ±MaxFrame
		return badInput("frame range %d-%d has more than %d frames", first, last, MaxFramesPerJob)
	}
	return nil
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
	st, err := scene.Resolve(render.Overrides{Camera: req.Camera, Width: req.Width, Height: req.Height, SPP: req.SPP})
	if err != nil {
		return nil, badInput("%v", err)
	}
	first, last := req.First, req.Last
	if req.SceneFrames {
		first, last = scene.Frames()
	}
	if err := CheckFrameRange(first, last); err != nil {
		return nil, err
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
	// A resubmission of a known job is answered even when the farm is busy: a cron job re-running
	// submit must see its job's state, not "busy".
	if res, ok, err := c.existing(ctx, p); ok || err != nil {
		return res, err
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
		if old, err := sameJob(tx, p); old != nil || err != nil {
			if old != nil {
				p.job = *old
			}
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
// have yet are added; a frame already assembled is assembled again for just those; a frame that
// failed is tried again.
func (c *Coordinator) shareFrame(tx *store.Tx, f *store.Frame, j *store.Job, now time.Time) error {
	f.JobIDs = append(f.JobIDs, j.ID)
	union, _ := farm.NormalizeFormats(append(slices.Clone(f.Formats), j.Formats...))
	grew := !slices.Equal(union, f.Formats)
	f.Formats = union
	if f.State == store.FrameFailed {
		if err := c.retryFrame(tx, f, j.ID, j.ID, now); err != nil {
			return err
		}
	} else if grew {
		if f.State == store.FrameCompleted {
			f.Move(store.FrameAssembling, "", now)
			if err := c.enqueueAssemble(tx, f, "formats"); err != nil {
				return err
			}
		}
	}
	return tx.PutFrame(f)
}

// sameJob returns the job already holding the plan's idempotency key, ErrConflict if that job
// was submitted with a different payload, or nil if the key is new.
func sameJob(tx *store.Tx, p *plan) (*store.Job, error) {
	old, err := tx.JobByIdempotencyKey(p.job.IdempotencyKey)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if old.PayloadHash != p.job.PayloadHash {
		return nil, fmt.Errorf("%w: idempotency key %q already names job %s with a different request", ErrConflict, p.job.IdempotencyKey, old.ID)
	}
	return old, nil
}

// existing answers a resubmission from a read-only look-up.
func (c *Coordinator) existing(ctx context.Context, p *plan) (SubmitResult, bool, error) {
	var old *store.Job
	err := c.store.View(ctx, func(tx *store.Tx) (err error) {
		old, err = sameJob(tx, p)
		return err
	})
	if err != nil || old == nil {
		return SubmitResult{}, false, err
	}
	st, err := c.Status(ctx, old.ID)
	return SubmitResult{Status: st}, true, err
}

func (c *Coordinator) addFrame(tx *store.Tx, j *store.Job, frame int, fk string, rects []render.Rect, now time.Time) error {
	f := &store.Frame{Key: fk, Frame: frame, SceneVersion: j.SceneVersion, Settings: j.Settings,
		Formats: j.Formats, JobIDs: []string{j.ID}, TileSize: j.TileSize, TilesTotal: len(rects)}
	f.Move(store.FrameQueued, "", now)
	for _, r := range rects {
		t := &store.Tile{Key: tiles.TileKey(fk, r), FrameKey: fk, Rect: r}
		if err := enqueueTile(tx, j.ID, f, t, t.Key, now); err != nil {
			return err
		}
	}
	return tx.PutFrame(f)
}

// enqueueTile queues a tile and writes the outbox record that dispatches it under msgID.
func enqueueTile(tx *store.Tx, jobID string, f *store.Frame, t *store.Tile, msgID string, now time.Time) error {
	t.Move(store.TileQueued, "", "", "", now)
	if err := tx.PutTile(t); err != nil {
		return err
	}
	data, err := json.Marshal(farm.TileJob{JobID: jobID, TileKey: t.Key, FrameKey: f.Key, SceneVersion: f.SceneVersion,
		Settings: f.Settings, Frame: f.Frame, Rect: t.Rect, InputHash: tiles.InputHash(f.SceneVersion, f.Settings, f.Frame, t.Rect)})
	if err != nil {
		return err
	}
	return tx.AddOutbox(queue.SubjectRender, msgID, data)
}

// retryFrame gives a failed frame another go: every tile not completed is queued again under a
// new dedup id made with retryID (completed tiles are reused), or, if only the assembly failed,
// the frame is assembled again.
func (c *Coordinator) retryFrame(tx *store.Tx, f *store.Frame, jobID, retryID string, now time.Time) error {
	ft, err := f.Tiles()
	if err != nil {
		return err
	}
	pending := 0
	for _, x := range ft {
		t, err := tx.Tile(x.Key)
		if err != nil {
			return err
		}
		if t.State == store.TileCompleted {
			continue
		}
		pending++
		// Only tiles that left the queue for good are queued again; the others still have
		// their message in TILES.
		if t.State != store.TileDeadLettered && t.State != store.TileFailedTerminal {
			continue
		}
		if err := enqueueTile(tx, jobID, f, t, t.Key+":retry:"+retryID, now); err != nil {
			return err
		}
	}
	f.TilesFailed = 0
	if pending > 0 {
		f.Move(store.FrameRendering, "", now)
		return nil
	}
	f.Move(store.FrameAssembling, "", now)
	return c.enqueueAssemble(tx, f, "retry")
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

// Retry gives every failed frame of a job another go (see retryFrame) and reports how many it
// retried. Re-running a one-shot render of a failed job calls it.
func (c *Coordinator) Retry(ctx context.Context, jobID string) (int, error) {
	n := 0
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil {
			return err
		}
		now := c.now()
		for _, fk := range j.FrameKeys {
			f, err := tx.Frame(fk)
			if err != nil {
				return err
			}
			if f.State != store.FrameFailed {
				continue
			}
			if err := c.retryFrame(tx, f, j.ID, fmt.Sprintf("%s-%d", j.ID, len(f.History)), now); err != nil {
				return err
			}
			if err := tx.PutFrame(f); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err == nil && n > 0 {
		c.kickRelay()
		c.notify()
	}
	return n, err
}
