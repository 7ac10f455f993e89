package coordinator

import (
	"context"
	"fmt"

	"github.com/tilefarm/tilefarm/internal/store"
)

// Job states as clients see them. They map onto the exit codes of `submit` and `status`.
const (
	StateQueued    = "queued"
	StateRendering = "rendering"
	StateCompleted = "completed"
	StateFailed    = "failed"
	StateCancelled = store.JobCancelled
)

// FrameStatus is one frame of a job.
type FrameStatus struct {
	Frame          int    `json:"frame"`
	FrameKey       string `json:"frame_key"`
	State          string `json:"state"`
	TilesTotal     int    `json:"tiles_total"`
	TilesCompleted int    `json:"tiles_completed"`
	Error          string `json:"error,omitempty"`
}

// Status is where a job stands. It is what `status --json` prints.
type Status struct {
	JobID            string        `json:"job_id"`
	State            string        `json:"state"`
	Scene            string        `json:"scene"`
	SceneVersion     string        `json:"scene_version"`
	Camera           string        `json:"camera"`
	FirstFrame       int           `json:"first_frame"`
	LastFrame        int           `json:"last_frame"`
	FramesTotal      int           `json:"frames_total"`
	FramesCompleted  int           `json:"frames_completed"`
	FramesFailed     int           `json:"frames_failed"`
	TilesTotal       int           `json:"tiles_total"`
	TilesCompleted   int           `json:"tiles_completed"`
	TilesFailed      int           `json:"tiles_failed"`
	TileAttempts     int           `json:"tile_attempts"`
	SamplesRecovered int           `json:"samples_recovered"`
	Frames           []FrameStatus `json:"frames"`
	Failures         []string      `json:"failures,omitempty"`
	// Filled in by clients for one request: tiles rendered by it and tiles already completed before it.
	TilesRendered int      `json:"tiles_rendered"`
	TilesReused   int      `json:"tiles_reused"`
	Outputs       []string `json:"outputs"`
}

// Status computes a job's status from the projection.
func (c *Coordinator) Status(ctx context.Context, jobID string) (Status, error) {
	var st Status
	err := c.store.View(ctx, func(tx *store.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil {
			return err
		}
		st, err = jobStatus(tx, j)
		return err
	})
	return st, err
}

// Jobs lists the status of every job, oldest first.
func (c *Coordinator) Jobs(ctx context.Context) ([]Status, error) {
	var out []Status
	err := c.store.View(ctx, func(tx *store.Tx) error {
		jobs, err := tx.Jobs()
		if err != nil {
			return err
		}
		for _, j := range jobs {
			st, err := jobStatus(tx, j)
			if err != nil {
				return err
			}
			st.Frames = nil
			out = append(out, st)
		}
		return nil
	})
	return out, err
}

func jobStatus(tx *store.Tx, j *store.Job) (Status, error) {
	st := Status{JobID: j.ID, Scene: j.SceneName, SceneVersion: j.SceneVersion, Camera: j.Camera,
		FirstFrame: j.First, LastFrame: j.Last, FramesTotal: len(j.FrameKeys), Outputs: []string{}}
	started := false
	for i, fk := range j.FrameKeys {
		f, err := tx.Frame(fk)
		if err != nil {
			return st, fmt.Errorf("job %s frame %d: %w", j.ID, j.First+i, err)
		}
		fs := FrameStatus{Frame: f.Frame, FrameKey: f.Key, State: f.State, TilesTotal: f.TilesTotal,
			TilesCompleted: f.TilesCompleted, Error: f.Error}
		st.TilesTotal += fs.TilesTotal
		st.TilesCompleted += fs.TilesCompleted
		st.TilesFailed += f.TilesFailed
		st.TileAttempts += f.TileAttempts
		st.SamplesRecovered += f.SamplesRecovered
		if f.State != store.FrameQueued {
			started = true
		}
		switch f.State {
		case store.FrameCompleted:
			st.FramesCompleted++
		case store.FrameFailed:
			st.FramesFailed++
			st.Failures = append(st.Failures, fmt.Sprintf("frame %d: %s", f.Frame, f.Error))
		}
		st.Frames = append(st.Frames, fs)
	}
	switch {
	case j.Cancelled:
		st.State = StateCancelled
	case st.FramesCompleted+st.FramesFailed == st.FramesTotal && st.FramesFailed > 0:
		st.State = StateFailed
	case st.FramesCompleted == st.FramesTotal:
		st.State = StateCompleted
	case started || st.TilesCompleted > 0:
		st.State = StateRendering
	default:
		st.State = StateQueued
	}
	return st, nil
}

// ExitCode maps a job state onto the command contract of DESIGN.md.
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
