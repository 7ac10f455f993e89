package coordinator

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/store"
)

// Job states as clients see them. They map onto the exit codes of `submit` and `status`.
var (
	StateQueued    = store.JobQueued.String()
	StateRendering = store.JobRendering.String()
	StateCompleted = store.JobCompleted.String()
	StateFailed    = store.JobFailed.String()
	StateCancelled = store.JobCancelled.String()
)

// FrameStatus is one frame of a job.
type FrameStatus struct {
	Frame          int    `json:"frame"`
	FrameKey       string `json:"frame_key"`
	State          string `json:"state"`
	TilesTotal     int    `json:"tiles_total"`
	TilesCompleted int    `json:"tiles_completed"`
	TilesFailed    int    `json:"tiles_failed"`
	SamplesTotal   int64  `json:"samples_total"` // tiles_total x spp
	SamplesDone    int64  `json:"samples_done"`  // completed tiles whole, tiles in progress as reported ("Progress")
	Error          string `json:"error,omitempty"`
}

// Status is where a job stands. It is what `status --json` prints.
type Status struct {
	JobID            string   `json:"job_id"`
	State            string   `json:"state"`
	Scene            string   `json:"scene"`
	SceneVersion     string   `json:"scene_version"`
	Camera           string   `json:"camera"`
	Formats          []string `json:"formats"`
	FirstFrame       int      `json:"first_frame"`
	LastFrame        int      `json:"last_frame"`
	FramesTotal      int      `json:"frames_total"`
	FramesCompleted  int      `json:"frames_completed"`
	FramesFailed     int      `json:"frames_failed"`
	TilesTotal       int      `json:"tiles_total"`
	TilesCompleted   int      `json:"tiles_completed"`
	TilesFailed      int      `json:"tiles_failed"`
	TileAttempts     int      `json:"tile_attempts"`
	SamplesRecovered int      `json:"samples_recovered"`
	SamplesTotal     int64    `json:"samples_total"` // the frames' sums: they move while a long tile renders
	SamplesDone      int64    `json:"samples_done"`
	Priority         int      `json:"priority"`
	// Created is when the job was submitted.
	Created time.Time `json:"created"`
	// ETASeconds is the estimated time left, from the samples per second measured over the
	// last minute; absent while unknown (too early, nothing moving) and once the job ended.
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
	// BlocklistedWorkers are the live workers that no longer take this job's tiles.
	BlocklistedWorkers []string      `json:"blocklisted_workers,omitempty"`
	Frames             []FrameStatus `json:"frames"`
	Failures           []string      `json:"failures,omitempty"`
	// Filled in by clients for one request: tiles rendered by it and tiles already completed before it.
	TilesRendered int      `json:"tiles_rendered"`
	TilesReused   int      `json:"tiles_reused"`
	Outputs       []string `json:"outputs"`
}

// Status computes a job's status from the projection: one frame record per frame, plus the
// failure details of failed frames and the samples of its tiles in progress.
func (c *Coordinator) Status(ctx context.Context, jobID string) (Status, error) {
	var st Status
	inProgress := c.progress.samples()
	err := c.store.View(ctx, func(tx *store.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil {
			return err
		}
		if st, err = c.statuses.status(tx, j); err == nil {
			addProgress(&st, inProgress)
		}
		return err
	})
	if err == nil {
		c.observe(&st)
	}
	return st, err
}

// observe adds what lives outside the store to a status: its ETA and its blocklisting workers.
func (c *Coordinator) observe(st *Status) {
	c.eta.observe(c.now(), st)
	st.BlocklistedWorkers = c.directory.blocklisting(st.JobID)
}

// Jobs lists the status of every job, oldest first, without their frames.
func (c *Coordinator) Jobs(ctx context.Context) ([]Status, error) {
	out, err := c.jobsWithFrames(ctx)
	for i := range out {
		out[i].Frames = nil
	}
	return out, err
}

// statusCache keeps each job's status as computed from the store, under the fingerprint of the
// records it came from (store.Tx.Fingerprint), so a viewer asking again while nothing of the
// job changed costs hashing its stored records instead of decoding every frame: the event
// stream recomputes every job, finished ones included, twice a second while a farm renders.
// A status with failed frames also reads tile tables and failures, which the fingerprint does
// not cover, and is never cached.
type statusCache struct {
	mu   sync.Mutex
	jobs map[string]cachedStatus
}

type cachedStatus struct {
	fingerprint uint64
	st          Status
}

// status is jobStatus(tx, j, tx.Frame), from the cache when j's records are as they were.
// Callers get a copy of their own: addProgress changes its frames.
func (sc *statusCache) status(tx *store.Tx, j *store.Job) (Status, error) {
	fp := tx.Fingerprint(j)
	sc.mu.Lock()
	c, ok := sc.jobs[j.ID]
	sc.mu.Unlock()
	if ok && c.fingerprint == fp {
		return c.st.clone(), nil
	}
	st, err := jobStatus(tx, j, tx.Frame)
	if err != nil {
		return st, err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if st.FramesFailed > 0 {
		delete(sc.jobs, j.ID)
		return st, nil
	}
	if sc.jobs == nil {
		sc.jobs = map[string]cachedStatus{}
	}
	sc.jobs[j.ID] = cachedStatus{fingerprint: fp, st: st.clone()}
	return st, nil
}

// keepOnly forgets the jobs not in ids (jobs the store no longer has).
func (sc *statusCache) keepOnly(ids map[string]bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for id := range sc.jobs {
		if !ids[id] {
			delete(sc.jobs, id)
		}
	}
}

// clone copies st deeply enough that changing the copy's frames, or appending to its lists,
// leaves st as it was.
func (st Status) clone() Status {
	st.Formats = slices.Clone(st.Formats)
	st.Frames = slices.Clone(st.Frames)
	st.Failures = slices.Clone(st.Failures)
	st.Outputs = slices.Clone(st.Outputs)
	st.BlocklistedWorkers = slices.Clone(st.BlocklistedWorkers)
	return st
}

// maxFailuresShown bounds the failure lines of one status.
const maxFailuresShown = 50

// jobStatus computes a job's status; frame looks its frames up (the transaction's, or a
// projection's that has them in memory already).
func jobStatus(tx *store.Tx, j *store.Job, frame func(fk string) (*store.Frame, error)) (Status, error) {
	st := Status{JobID: j.ID, Scene: j.SceneName, SceneVersion: j.SceneVersion, Camera: j.Camera, Formats: j.Formats,
		FirstFrame: j.First, LastFrame: j.Last, FramesTotal: j.Frames(), Priority: j.Priority, Created: j.Created, Outputs: []string{}}
	states := make([]store.FrameState, 0, j.Frames())
	for n := j.First; n <= j.Last; n++ {
		f, err := frame(j.FrameKey(n))
		if err != nil {
			return st, fmt.Errorf("job %s frame %d: %w", j.ID, n, err)
		}
		s := f.StateFor(j.Formats)
		states = append(states, s)
		spp := int64(f.Settings.SPP)
		fs := FrameStatus{Frame: f.Frame, FrameKey: f.Key, State: s.String(), TilesTotal: f.TilesTotal,
			TilesCompleted: f.TilesCompleted, TilesFailed: f.TilesFailed,
			SamplesTotal: int64(f.TilesTotal) * spp, SamplesDone: int64(f.TilesCompleted) * spp}
		st.SamplesTotal += fs.SamplesTotal
		st.SamplesDone += fs.SamplesDone
		st.TilesTotal += f.TilesTotal
		st.TilesCompleted += f.TilesCompleted
		st.TilesFailed += f.TilesFailed
		st.TileAttempts += f.TileAttempts
		st.SamplesRecovered += f.SamplesRecovered
		switch s {
		case store.FrameCompleted:
			st.FramesCompleted++
		case store.FrameFailed:
			st.FramesFailed++
			fs.Error = frameError(tx, f)
			if len(st.Failures) < maxFailuresShown {
				st.Failures = append(st.Failures, fmt.Sprintf("frame %d: %s", f.Frame, fs.Error))
			}
		}
		st.Frames = append(st.Frames, fs)
	}
	st.State = j.State(states).String()
	switch {
	case st.State == StateCancelled:
		st.Failures = append([]string{"cancelled at " + j.Cancelled.Format(time.RFC3339)}, st.Failures...)
	case j.Failed != "" && st.State == StateFailed:
		st.Failures = append([]string{j.Failed}, st.Failures...)
	}
	return st, nil
}

// addProgress adds the samples reported of tiles in progress (progressTracker.samples) to the
// frames that have any. A frame's samples never exceed what its tiles not completed yet can
// hold, so a report about a tile completed meanwhile, or a forged one, cannot count beyond it.
// Frames with nothing in progress cost a map lookup, none when nothing is in progress.
func addProgress(st *Status, inProgress map[string]int64) {
	if len(inProgress) == 0 {
		return
	}
	for i := range st.Frames {
		fs := &st.Frames[i]
		n, ok := inProgress[fs.FrameKey]
		if !ok {
			continue
		}
		n = min(n, fs.SamplesTotal-fs.SamplesDone)
		fs.SamplesDone += n
		st.SamplesDone += n
	}
}

// frameError says why a frame failed: its dead-lettered tiles with their last error, or its
// assembly's.
func frameError(tx *store.Tx, f *store.Frame) string {
	if f.AssemblyError != "" && f.TilesFailed == 0 {
		return "assembly: " + f.AssemblyError
	}
	table, err := tx.TileTable(f)
	if err != nil {
		return err.Error()
	}
	failures, err := tx.Failures(f.Key)
	if err != nil {
		return err.Error()
	}
	ft, err := f.Tiles()
	if err != nil {
		return err.Error()
	}
	var dead []int
	for i := range ft {
		if s, _ := table.Get(i); s == store.TileDeadLettered {
			dead = append(dead, i)
		}
	}
	sort.Ints(dead)
	if len(dead) == 0 {
		return "failed"
	}
	i := dead[0]
	r := ft[i].Rect
	msg := fmt.Sprintf("tile %s (%d,%d)-(%d,%d) dead-lettered", ft[i].Key[:12], r.X0, r.Y0, r.X1, r.Y1)
	if l := failures[i]; len(l) > 0 {
		last := l[len(l)-1]
		msg += fmt.Sprintf(" [%s]: %s", last.Code, last.Error)
	}
	if len(dead) > 1 {
		msg += fmt.Sprintf(" (and %d more tiles)", len(dead)-1)
	}
	return msg
}

// ExitCode maps a job state onto the exit codes of `submit` and `status` (docs/operations.md).
func ExitCode(state string) int {
	switch state {
	case StateCompleted:
		return 0
	case StateQueued:
		return 42
	case StateRendering:
		return 3
	default:
		return 1
	}
}
