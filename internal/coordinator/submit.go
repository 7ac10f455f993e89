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

// plan is a submission being resolved by submitSteps: the request, what each step found so far,
// and the job they make.
type plan struct {
	req      api.SubmitRequest
	sc       *sceneInfo
	st       render.Settings // the resolved settings
	requires []string        // tags, normalized
	live     []api.Worker    // the worker directory as submit found it
	build    string
	first    int
	last     int
	step     int // 0: every frame
	size     int // tile size
	tiles    int // tiles of a frame
	formats  []string
	job      *coorddb.Job
	notes    []string // for the artist: how the farm renders the job where it is not obvious
}

// frames is how many frames the plan's range and step make.
func (pl *plan) frames() int { return (pl.last-pl.first)/max(pl.step, 1) + 1 }

// submitStep is one feature of a submission: it checks its part of the request and resolves
// it into the plan, as a hook of a job endpoint does. A step sees what the steps before it
// found and changes no state.
type submitStep struct {
	name string
	run  func(c *Coordinator, ctx context.Context, pl *plan) error
}

// submitSteps are the features of a submission in the order they resolve it: the one place
// the order is written down. A new submission feature is one entry here.
var submitSteps = []submitStep{
	{name: "limits", run: checkLimits},
	{name: "scene", run: resolveScene},
	{name: "tags", run: resolveTags},
	{name: "slots", run: checkSlots},
	{name: "build", run: resolveBuild},
	{name: "frames", run: resolveFrames},
	{name: "frame step", run: resolveStep},
	{name: "preview", run: checkPreview},
	{name: "tile size", run: resolveTileSize},
	{name: "formats", run: resolveFormats},
	{name: "job", run: makeJob},
	{name: "pool", run: checkJobPool},
	{name: "notifications", run: resolveNotify},
	{name: "dependencies", run: resolveAfter},
}

// planSubmission resolves a request into a job without touching any state: submitSteps in
// order. It returns the job, the tiles of one of its frames and the notes for the artist.
func (c *Coordinator) planSubmission(ctx context.Context, req api.SubmitRequest) (*coorddb.Job, int, []string, error) {
	pl := &plan{req: req}
	for _, s := range submitSteps {
		if err := s.run(c, ctx, pl); err != nil {
			return nil, 0, nil, err
		}
	}
	return pl.job, pl.tiles, pl.notes, nil
}

// checkLimits bounds the request's idempotency key, project name and priority.
func checkLimits(_ *Coordinator, _ context.Context, pl *plan) error {
	switch req := pl.req; {
	case len(req.IdempotencyKey) > MaxIdempotencyKey:
		return badInput("idempotency key is %d bytes, at most %d", len(req.IdempotencyKey), MaxIdempotencyKey)
	case len(req.Project) > MaxProjectName:
		return badInput("project name is %d bytes, at most %d", len(req.Project), MaxProjectName)
	case req.Priority < api.MinPriority || req.Priority > api.MaxPriority:
		return badInput("priority %d: want %d to %d", req.Priority, api.MinPriority, api.MaxPriority)
	}
	return nil
}

// resolveScene finds the stored scene and resolves the request's settings against it.
func resolveScene(c *Coordinator, ctx context.Context, pl *plan) error {
	sc, err := c.scene(ctx, pl.req.SceneVersion)
	if err == nil {
		// What the cache holds of a scene is trusted only while its manifest is stored: scene
		// gc may have deleted it after a load that began before (CollectScenes).
		var ok bool
		if ok, err = c.HasScene(ctx, pl.req.SceneVersion); err == nil && !ok {
			c.scenes.Forget(pl.req.SceneVersion)
			err = fmt.Errorf("%w: scene %s: upload it first (PUT /v1/scenes/%s)", ErrSceneMissing, pl.req.SceneVersion, pl.req.SceneVersion)
		}
	}
	if err != nil {
		if errors.Is(err, ErrSceneMissing) {
			return badInput("%v", err)
		}
		return err
	}
	req := pl.req
	st, err := sc.info.Resolve(render.Overrides{Camera: req.Camera, Width: req.Width, Height: req.Height, SPP: req.SPP, Passes: req.Passes, Split: req.Split})
	if err != nil {
		return badInput("%v", err)
	}
	pl.sc, pl.st = sc, st
	return nil
}

// resolveTags normalizes the tags a worker must carry.
func resolveTags(_ *Coordinator, _ context.Context, pl *plan) error {
	requires, err := api.Tags(pl.req.Requires)
	if err != nil {
		return badInput("required tags: %v", err)
	}
	pl.requires = requires
	return nil
}

// checkSlots bounds the job's slot limit.
func checkSlots(_ *Coordinator, _ context.Context, pl *plan) error {
	if n := pl.req.MaxSlots; n < 0 || n > MaxSlots {
		return badInput("max slots %d: want 0 (no limit) to %d", n, MaxSlots)
	}
	return nil
}

// resolveBuild chooses the renderer build among the live workers (renderBuild).
func resolveBuild(c *Coordinator, ctx context.Context, pl *plan) error {
	pl.live = c.directory.list()
	build, note, err := c.renderBuild(ctx, pl.sc.kind, pl.sc.info, &pl.st, pl.req.Build, pl.requires, pl.live)
	pl.build = build
	if note != "" {
		pl.notes = append(pl.notes, note)
	}
	return err
}

// resolveFrames takes the range asked for, or the scene's own.
func resolveFrames(_ *Coordinator, _ context.Context, pl *plan) error {
	pl.first, pl.last = pl.req.First, pl.req.Last
	if pl.req.SceneFrames {
		pl.first, pl.last = pl.sc.info.Frames()
	}
	return CheckFrameRange(pl.first, pl.last)
}

// resolveStep takes the frame step asked for, or the scene's own.
func resolveStep(_ *Coordinator, _ context.Context, pl *plan) error {
	step := pl.req.Step
	switch {
	case step == 0:
		step = pl.sc.info.FrameStep()
	case step < 0 || step > render.MaxFrame:
		return badInput("frame step %d: want 1 to %d", step, render.MaxFrame)
	}
	if step == 1 {
		step = 0 // every frame: jobs of every frame are stored and hashed as before steps existed
	}
	pl.step = step
	return nil
}

// checkPreview bounds the preview interval.
func checkPreview(_ *Coordinator, _ context.Context, pl *plan) error {
	if n := pl.req.Preview; n < 0 || n > render.MaxFrame {
		return badInput("preview %d: want 0 (none) to %d", n, render.MaxFrame)
	}
	return nil
}

// resolveTileSize takes the tile size asked for, or the kind's; a frame that renders whole is
// one tile (docs/design.md, "Blender scenes"). The job's tiles are bounded.
func resolveTileSize(_ *Coordinator, _ context.Context, pl *plan) error {
	st := pl.st
	size := pl.req.TileSize
	switch {
	case st.Whole:
		size = max(st.Width, st.Height)
		if size > tiles.MaxTileSize {
			return badInput("a %dx%d frame that renders whole is larger than a tile may be (%d px): submit it with split", st.Width, st.Height, tiles.MaxTileSize)
		}
	case size == 0:
		size = pl.sc.kind.TileSize()
	}
	rects, err := tiles.Split(st.Width, st.Height, size)
	if err != nil {
		return badInput("tile size: %v", err)
	}
	if frames := pl.frames(); len(rects)*frames > MaxTilesPerJob {
		return badInput("%d frames of %d tiles exceed %d tiles per job", frames, len(rects), MaxTilesPerJob)
	}
	pl.size, pl.tiles = size, len(rects)
	return nil
}

// resolveFormats takes the formats asked for, or the kind's default, each one the kind writes.
func resolveFormats(_ *Coordinator, _ context.Context, pl *plan) error {
	kind := pl.sc.kind
	asked := pl.req.Formats
	if len(asked) == 0 {
		asked = kind.Formats()[:1]
	}
	formats, err := layout.NormalizeFormats(asked)
	if err != nil {
		return badInput("%v", err)
	}
	for _, f := range formats {
		if !slices.Contains(kind.Formats(), f) {
			return badInput("output format %q: a %s is written as %s", f, kind.Name(), strings.Join(kind.Formats(), ", "))
		}
	}
	pl.formats = formats
	return nil
}

// makeJob makes the job and its identities (docs/design.md, "Identities") from what the steps
// before resolved.
func makeJob(c *Coordinator, _ context.Context, pl *plan) error {
	req, st := pl.req, pl.st
	sv := req.SceneVersion
	sh := identity.SettingsHash(st)
	payload, _ := json.Marshal(canonicalPayload{Project: req.Project, SceneVersion: sv, Camera: st.Camera,
		First: pl.first, Last: pl.last, Step: pl.step, SettingsHash: sh, Formats: pl.formats})
	key := req.IdempotencyKey
	if key == "" {
		key = identity.DerivedIdempotencyKey(req.Project, sv, st.Camera, pl.first, pl.last, pl.step, sh, pl.formats)
	}
	pl.job = &coorddb.Job{
		ID: identity.JobID(key), IdempotencyKey: key, PayloadHash: identity.PayloadHash(payload), Project: req.Project,
		SceneVersion: sv, SceneName: pl.sc.name, Camera: st.Camera, First: pl.first, Last: pl.last, Step: pl.step, Preview: req.Preview,
		Settings: st, SettingsHash: sh, TileSize: pl.size, Priority: req.Priority, Formats: pl.formats, Requires: pl.requires,
		MaxSlots: req.MaxSlots, Build: pl.build, Created: c.now(), NoMovie: req.NoMovie,
	}
	return nil
}

// checkJobPool refuses a job no live worker could render (checkPool).
func checkJobPool(_ *Coordinator, _ context.Context, pl *plan) error {
	return checkPool(jobPool(pl.job), pl.live)
}

// resolveNotify takes the job's own webhook receivers (checkNotify).
func resolveNotify(c *Coordinator, ctx context.Context, pl *plan) error {
	urls, err := c.checkNotify(ctx, pl.req.Notify)
	if err != nil {
		return err
	}
	pl.job.Notify, pl.job.NotifyFrames = urls, pl.req.NotifyFrames
	return nil
}

// resolveAfter takes the jobs the job waits for: a scheduling choice, outside the payload hash,
// so a resubmission naming other jobs returns the first job (docs/design.md, "Jobs that wait
// for jobs").
func resolveAfter(_ *Coordinator, _ context.Context, pl *plan) error {
	after, afterFrames, err := normalizeAfter(pl.req.After, pl.req.AfterFrames)
	pl.job.After, pl.job.AfterFrames = after, afterFrames
	return err
}

// Submit records a job, its frames and one outbox record per new frame in one transaction:
// O(frames) records, whatever the tile count. The same idempotency key with the same payload
// returns the existing job; with another payload it is a conflict. Frames already known
// (completed by an earlier job, or in progress) are shared, not rendered again.
func (c *Coordinator) Submit(ctx context.Context, req api.SubmitRequest) (res api.SubmitResult, err error) {
	defer func() { c.countSubmission(res, err) }()
	// The scene's manifest stays while the job is made: scene gc (CollectScenes) deletes only
	// manifests of scenes no job names, between submissions.
	c.sceneGC.RLock()
	defer c.sceneGC.RUnlock()
	j, ntiles, notes, err := c.planSubmission(ctx, req)
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
		res.Notes = notes
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
		// The job its frames' changes find; flush writes it.
		p.addJob(j)
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
			if _, err := p.add(&coorddb.Frame{Key: fk, Frame: n, SceneVersion: j.SceneVersion, Settings: j.Settings,
				Formats: j.Formats, JobIDs: []string{j.ID}, TileSize: j.TileSize, TilesTotal: ntiles, Held: !start}); err != nil {
				return err
			}
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
	return api.SubmitResult{Status: st, Created: created, Notes: notes}, nil
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
