package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// Limits on a submission, so a typo cannot enqueue a million frames.
const (
	MaxFramesPerJob   = 100000
	MaxTilesPerJob    = 2_000_000
	MaxIdempotencyKey = 256
	MaxProjectName    = 256
	MaxSlots          = 100000
)

// canonicalPayload is what payload_hash covers: everything that decides the job's outputs.
// Tile size and priority are scheduling hints and are left out, so resubmitting with another
// tile size returns the same job instead of a conflict.
type canonicalPayload struct {
	Project      string   `json:"project"`
	SceneVersion string   `json:"scene_version"`
	Camera       string   `json:"camera"`
	First        int      `json:"first"`
	Last         int      `json:"last"`
	Step         int      `json:"step,omitempty"` // more than 1 only
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
	return fmt.Errorf("%w: %s", api.ErrBadInput, fmt.Sprintf(format, args...))
}

// planSubmission resolves a request into a job without touching any state.
func (c *Coordinator) planSubmission(ctx context.Context, req api.SubmitRequest) (*coorddb.Job, int, error) {
	switch {
	case len(req.IdempotencyKey) > MaxIdempotencyKey:
		return nil, 0, badInput("idempotency key is %d bytes, at most %d", len(req.IdempotencyKey), MaxIdempotencyKey)
	case len(req.Project) > MaxProjectName:
		return nil, 0, badInput("project name is %d bytes, at most %d", len(req.Project), MaxProjectName)
	case req.Priority < api.MinPriority || req.Priority > api.MaxPriority:
		return nil, 0, badInput("priority %d: want %d to %d", req.Priority, api.MinPriority, api.MaxPriority)
	}
	sc, err := c.scene(ctx, req.SceneVersion)
	if err != nil {
		if errors.Is(err, ErrSceneMissing) {
			return nil, 0, badInput("%v", err)
		}
		return nil, 0, err
	}
	st, err := sc.info.Resolve(render.Overrides{Camera: req.Camera, Width: req.Width, Height: req.Height, SPP: req.SPP, Passes: req.Passes, Split: req.Split})
	if err != nil {
		return nil, 0, badInput("%v", err)
	}
	requires, err := api.Tags(req.Requires)
	if err != nil {
		return nil, 0, badInput("required tags: %v", err)
	}
	if req.MaxSlots < 0 || req.MaxSlots > MaxSlots {
		return nil, 0, badInput("max slots %d: want 0 (no limit) to %d", req.MaxSlots, MaxSlots)
	}
	live := c.directory.list()
	build, err := c.renderBuild(ctx, sc.kind, &st, req.Build, requires, live)
	if err != nil {
		return nil, 0, err
	}
	first, last := req.First, req.Last
	if req.SceneFrames {
		first, last = sc.info.Frames()
	}
	if err := CheckFrameRange(first, last); err != nil {
		return nil, 0, err
	}
	step := req.Step
	switch {
	case step == 0:
		step = sc.info.FrameStep()
	case step < 0 || step > render.MaxFrame:
		return nil, 0, badInput("frame step %d: want 1 to %d", step, render.MaxFrame)
	}
	if step == 1 {
		step = 0 // every frame: jobs of every frame are stored and hashed as before steps existed
	}
	if req.Preview < 0 || req.Preview > render.MaxFrame {
		return nil, 0, badInput("preview %d: want 0 (none) to %d", req.Preview, render.MaxFrame)
	}
	frames := (last-first)/max(step, 1) + 1
	size := req.TileSize
	switch {
	case st.Whole:
		// The frame renders whole: one tile, whatever was asked (docs/design.md, "Blender scenes").
		size = max(st.Width, st.Height)
		if size > tiles.MaxTileSize {
			return nil, 0, badInput("a %dx%d frame that renders whole is larger than a tile may be (%d px): submit it with split", st.Width, st.Height, tiles.MaxTileSize)
		}
	case size == 0:
		size = sc.kind.TileSize()
	}
	rects, err := tiles.Split(st.Width, st.Height, size)
	if err != nil {
		return nil, 0, badInput("tile size: %v", err)
	}
	if len(rects)*frames > MaxTilesPerJob {
		return nil, 0, badInput("%d frames of %d tiles exceed %d tiles per job", frames, len(rects), MaxTilesPerJob)
	}
	asked := req.Formats
	if len(asked) == 0 {
		asked = sc.kind.Formats()[:1]
	}
	formats, err := layout.NormalizeFormats(asked)
	if err != nil {
		return nil, 0, badInput("%v", err)
	}
	for _, f := range formats {
		if !slices.Contains(sc.kind.Formats(), f) {
			return nil, 0, badInput("output format %q: a %s is written as %s", f, sc.kind.Name(), strings.Join(sc.kind.Formats(), ", "))
		}
	}
	sv := req.SceneVersion
	sh := identity.SettingsHash(st)
	payload, _ := json.Marshal(canonicalPayload{Project: req.Project, SceneVersion: sv, Camera: st.Camera,
		First: first, Last: last, Step: step, SettingsHash: sh, Formats: formats})
	key := req.IdempotencyKey
	if key == "" {
		key = identity.DerivedIdempotencyKey(req.Project, sv, st.Camera, first, last, step, sh, formats)
	}
	j := &coorddb.Job{
		ID: identity.JobID(key), IdempotencyKey: key, PayloadHash: identity.PayloadHash(payload), Project: req.Project,
		SceneVersion: sv, SceneName: sc.name, Camera: st.Camera, First: first, Last: last, Step: step, Preview: req.Preview, Settings: st,
		SettingsHash: sh, TileSize: size, Priority: req.Priority, Formats: formats, Requires: requires, MaxSlots: req.MaxSlots, Build: build, Created: c.now(),
		NoMovie: req.NoMovie,
	}
	if err := checkPool(jobPool(j), live); err != nil {
		return nil, 0, err
	}
	if j.Notify, err = c.checkNotify(ctx, req.Notify); err != nil {
		return nil, 0, err
	}
	j.NotifyFrames = req.NotifyFrames
	// What the job waits for is a scheduling choice, outside the payload hash: a resubmission
	// naming other jobs returns the first job.
	if j.After, j.AfterFrames, err = normalizeAfter(req.After, req.AfterFrames); err != nil {
		return nil, 0, err
	}
	return j, len(rects), nil
}

// Submit records a job, its frames and one outbox record per new frame in one transaction:
// O(frames) records, whatever the tile count. The same idempotency key with the same payload
// returns the existing job; with another payload it is a conflict. Frames already known
// (completed by an earlier job, or in progress) are shared, not rendered again.
func (c *Coordinator) Submit(ctx context.Context, req api.SubmitRequest) (res api.SubmitResult, err error) {
	defer func() { c.countSubmission(res, err) }()
	j, ntiles, err := c.planSubmission(ctx, req)
	if err != nil {
		return api.SubmitResult{}, err
	}
	// Jobs named to wait for are checked before anything else, a resubmission's too: naming
	// itself, or a job that waits for it, is a cycle whether the job is new or not.
	if len(j.Upstream()) > 0 {
		if err := c.db.View(ctx, func(tx *coorddb.Tx) error { return checkDeps(tx, j) }); err != nil {
			return api.SubmitResult{}, err
		}
	}
	// A resubmission of a known job is answered even when the farm is busy: a cron job re-running
	// submit must see its job's state, not "busy".
	if res, ok, err := c.existing(ctx, j); ok || err != nil {
		return res, err
	}
	created := false
	var st api.Status
	var p *projection
	err = c.db.Update(ctx, func(tx *coorddb.Tx) error {
		if old, err := sameJob(tx, j); old != nil || err != nil {
			if old != nil {
				st, err = jobStatus(tx, old, tx.Frame)
			}
			return err
		}
		if err := c.admit(tx, ntiles*j.Frames()); err != nil {
			return err
		}
		if err := checkDeps(tx, j); err != nil {
			return err
		}
		created = true
		p = c.newProjection(ctx, tx)
		// The job its frames' changes find, before it is written.
		p.jobs = map[string]*coorddb.Job{j.ID: j}
		// Announced from now on: a job whose frames are all done completes here.
		p.touchJob(j.ID)
		deps := newDepView(tx, p.lookup)
		for n := range j.DispatchOrder() { // the relay publishes the outbox in order
			fk := j.FrameKey(n)
			// A frame whose job waits for what has not completed is recorded, not started
			// (docs/design.md, "Jobs that wait for jobs"): releaseWaiting starts it.
			dep, err := deps.dep(j, n)
			if err != nil {
				return err
			}
			start := dep == coorddb.DepSatisfied
			if _, err := p.frame(fk); err == nil {
				if err := c.shareFrame(p, fk, j, start); err != nil {
					return err
				}
				continue
			} else if !errors.Is(err, coorddb.ErrNotFound) {
				return err
			}
			p.add(&coorddb.Frame{Key: fk, Frame: n, SceneVersion: j.SceneVersion, Settings: j.Settings,
				Formats: j.Formats, JobIDs: []string{j.ID}, TileSize: j.TileSize, TilesTotal: ntiles, Held: !start})
			if !start {
				continue
			}
			if err := tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxTiles, FrameKey: fk, JobID: j.ID, Priority: j.Priority, First: true}); err != nil {
				return err
			}
		}
		for _, up := range j.Upstream() {
			if err := tx.AddDependent(up, j.ID); err != nil {
				return err
			}
		}
		// A job of frames all completed before is completed as it is submitted: its movie is
		// asked for now, as flush asks for a job's that its frames complete (movie.go).
		if err := p.movieIfCompleted(j); err != nil {
			return err
		}
		if err := tx.PutJob(j); err != nil {
			return err
		}
		if _, err := p.flush(); err != nil {
			return err
		}
		// The answer comes from the frames in memory: no need to read back what was just written.
		st, err = jobStatus(tx, j, p.lookup)
		return err
	})
	if err != nil {
		return api.SubmitResult{}, err
	}
	if created {
		c.faults.At(c.log, faults.SubmitAfterCommit)
		c.counted(p)
		c.kickRelay()
		c.notify()
		c.eta.observe(c.now(), &st)
	}
	return api.SubmitResult{Status: st, Created: created}, nil
}

// countSubmission counts a submission's answer in tilefarm_submissions_total; a request
// refused as bad input, or failing on the coordinator's side, is not counted.
func (c *Coordinator) countSubmission(res api.SubmitResult, err error) {
	result := ""
	switch {
	case err == nil && res.Created:
		result = metrics.SubmissionCreated
	case err == nil:
		result = metrics.SubmissionExisting
	case errors.Is(err, api.ErrConflict):
		result = metrics.SubmissionConflict
	case errors.Is(err, api.ErrBusy):
		result = metrics.SubmissionBusy
	default:
		return
	}
	c.m.Submissions.WithLabelValues(result).Inc()
}

// shareFrame attaches a job to a frame another job already asked for. Formats the frame does
// not have yet are added (a frame whose tiles are done is assembled again for them, by flush).
// With start, the frame is made to render for the job (startFrame: a held frame dispatched, a
// dropped one revived, a failed one retried); without, the job waits for other jobs and the
// frame is left as it is until it may start.
func (c *Coordinator) shareFrame(p *projection, fk string, j *coorddb.Job, start bool) error {
	e, err := p.edit(fk)
	if err != nil {
		return err
	}
	f := e.f
	if !slices.Contains(f.JobIDs, j.ID) {
		f.JobIDs = append(f.JobIDs, j.ID)
	}
	union, err := layout.NormalizeFormats(append(slices.Clone(f.Formats), j.Formats...))
	if err != nil {
		return err
	}
	f.Formats = union
	if !start {
		return nil
	}
	return c.startFrame(p, e, j)
}

// sameJob returns the job already holding the idempotency key of j, ErrConflict if that job
// was submitted with a different payload, or nil if the key is new.
func sameJob(tx *coorddb.Tx, j *coorddb.Job) (*coorddb.Job, error) {
	old, err := tx.JobByIdempotencyKey(j.IdempotencyKey)
	if errors.Is(err, coorddb.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if old.PayloadHash != j.PayloadHash {
		return nil, fmt.Errorf("%w: idempotency key %q already names job %s with a different request", api.ErrConflict, j.IdempotencyKey, old.ID)
	}
	return old, nil
}

// existing answers a resubmission from a read-only look-up.
func (c *Coordinator) existing(ctx context.Context, j *coorddb.Job) (api.SubmitResult, bool, error) {
	var old *coorddb.Job
	err := c.db.View(ctx, func(tx *coorddb.Tx) (err error) {
		old, err = sameJob(tx, j)
		return err
	})
	if err != nil || old == nil {
		return api.SubmitResult{}, false, err
	}
	st, err := c.Status(ctx, old.ID)
	return api.SubmitResult{Status: st}, true, err
}

// Retry gives every failed frame of a job another go (see projection.retry) and reports how
// many it retried. Re-running a one-shot render of a failed job calls it.
func (c *Coordinator) Retry(ctx context.Context, jobID string) (int, error) {
	n := 0
	err := c.update(ctx, func(p *projection) error {
		j, err := p.tx.Job(jobID)
		if err != nil {
			return err
		}
		for f := range j.FrameNumbers() {
			e, err := p.frame(j.FrameKey(f))
			if err != nil {
				return err
			}
			if e.f.StateFor(j.Formats) != coorddb.FrameFailed {
				continue
			}
			ok, err := p.retry(e.f.Key, j)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		return nil
	})
	return n, err
}
