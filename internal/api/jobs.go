package api

import "time"

// JobState is where a job stands as a whole.
type JobState string

// The states of a job; they map onto the exit codes of submit and status (ExitCode).
const (
	JobQueued    JobState = "queued"
	JobRendering JobState = "rendering"
	JobCompleted JobState = "completed"
	JobFailed    JobState = "failed"
	JobCancelled JobState = "cancelled"
	// JobWaiting is a job accepted and queued behind the jobs it waits for (submit --after,
	// --after-frames): nothing of it is dispatched until they complete.
	JobWaiting JobState = "waiting"
	// JobBlocked is a job whose frames are all finished or blocked, some blocked: a job it
	// waits for failed or was cancelled (Status.BlockedReason says which). It starts if that
	// job is retried and completes.
	JobBlocked JobState = "blocked"
)

// Finished reports whether the job will change no more by itself: completed, failed,
// cancelled, or blocked (until an operator retries what it waits for).
func (s JobState) Finished() bool { return s != JobQueued && s != JobRendering && s != JobWaiting }

// ExitCode is the exit code of submit and status for a job in this state: 0 completed, 42
// queued or waiting, 3 rendering, 1 failed, blocked or cancelled.
func (s JobState) ExitCode() int {
	switch s {
	case JobCompleted:
		return ExitOK
	case JobQueued, JobWaiting:
		return ExitQueued
	case JobRendering:
		return ExitInProgress
	}
	return ExitFailed
}

// FrameState is where one frame of a job stands.
type FrameState string

// The states of a frame.
const (
	FrameQueued     FrameState = "queued"
	FrameRendering  FrameState = "rendering"
	FrameAssembling FrameState = "assembling"
	FrameCompleted  FrameState = "completed"
	FrameFailed     FrameState = "failed"
	// FrameWaiting and FrameBlocked are a frame not completed of a job that waits for other
	// jobs: not dispatched for it yet, or never while what it waits for failed.
	FrameWaiting FrameState = "waiting"
	FrameBlocked FrameState = "blocked"
)

// TileState is where one tile stands.
type TileState string

// The states of a tile.
const (
	TileQueued          TileState = "queued"
	TileRendering       TileState = "rendering"
	TileFailedRetryable TileState = "failed_retryable"
	TileDeadLettered    TileState = "dead_lettered"
	TileCompleted       TileState = "completed"
)

// Priority limits of a job: an integer in [MinPriority, MaxPriority]; negative ones render in
// the low band, 0 in the normal band, positive ones in the high band.
const (
	MinPriority = -100
	MaxPriority = 100
)

// SubmitRequest is what a client sends to submit a job. The scene is uploaded before, once,
// under its scene version (PUT /v1/scenes/{version}).
type SubmitRequest struct {
	SceneVersion   string   `json:"scene_version"`
	Project        string   `json:"project,omitempty"`
	Camera         string   `json:"camera,omitempty"`
	First          int      `json:"first"`
	Last           int      `json:"last"`
	SceneFrames    bool     `json:"scene_frames,omitempty"` // render the scene's own frame range; First and Last are ignored
	Step           int      `json:"step,omitempty"`         // every Step-th frame from First to Last; 0 is the scene's frame step (a .blend's), else 1
	Preview        int      `json:"preview,omitempty"`      // render first frames First, First+Preview, ... and Last, then the rest
	SPP            int      `json:"spp,omitempty"`
	Passes         int      `json:"passes,omitempty"` // Blender scenes: passes a tile's samples are split into (default 4)
	Split          bool     `json:"split,omitempty"`  // Blender scenes: split frames that would render whole, switching off what cannot be split
	Width          int      `json:"width,omitempty"`
	Height         int      `json:"height,omitempty"`
	TileSize       int      `json:"tile_size,omitempty"` // default 64, 256 for Blender scenes
	Priority       int      `json:"priority,omitempty"`
	Formats        []string `json:"formats,omitempty"` // none: the scene kind's default (a Blender scene's own output, "blend")
	IdempotencyKey string   `json:"idempotency_key,omitempty"`
	// Requires are tags a worker must carry to render the job (tileworker --tags).
	Requires []string `json:"requires,omitempty"`
	// Build names the renderer build to render with (a part of a live worker's, e.g. "3.4.1"
	// or "cycles-cpu/sse41"); empty lets the farm choose among its live workers'.
	Build string `json:"build,omitempty"`
	// MaxSlots is how many of the job's tiles may render at once; 0 is no limit.
	MaxSlots int `json:"max_slots,omitempty"`
	// Notify are webhook receivers of the job's events (http or https URLs, at most 8), on top
	// of the farm's; NotifyFrames asks for an event per frame completed or failed as well.
	// Neither is part of the job's identity.
	Notify       []string `json:"notify,omitempty"`
	NotifyFrames bool     `json:"notify_frames,omitempty"`
	// After names jobs that must complete before any frame of this one is dispatched;
	// AfterFrames a job whose frame N must complete before this job's frame N is. Unknown jobs
	// and cycles are bad input. Scheduling choices: a resubmission returns the first job.
	After       []string `json:"after,omitempty"`
	AfterFrames string   `json:"after_frames,omitempty"`
	// NoMovie skips the job's preview movie (docs/design.md, "Preview movie").
	NoMovie bool `json:"no_movie,omitempty"`
}

// MovieState is where a job's preview movie stands.
type MovieState string

// The states of a preview movie: pending until the job completes and a worker has encoded it,
// then ready or failed; skipped for a job submitted without one or that did not complete.
const (
	MoviePending MovieState = "pending"
	MovieReady   MovieState = "ready"
	MovieFailed  MovieState = "failed"
	MovieSkipped MovieState = "skipped"
)

// Movie is a job's preview movie: its state, where to fetch it once ready (URL, a path of the
// API) and, when it failed or was skipped, why.
type Movie struct {
	State  MovieState `json:"state"`
	URL    string     `json:"url,omitempty"`
	Reason string     `json:"reason,omitempty"`
}

// SubmitResult says which job holds the request and whether this call created it.
type SubmitResult struct {
	Status  Status `json:"status"`
	Created bool   `json:"created"`
	// Notes say how the farm renders the job where the artist would not expect it (a .blend
	// rendering on a newer Blender line than the one that saved it), one line each.
	Notes []string `json:"notes,omitempty"`
}

// PriorityRequest is the body of PUT /v1/jobs/{id}/priority.
type PriorityRequest struct {
	Priority *int `json:"priority"`
}

// FrameStatus is one frame of a job.
type FrameStatus struct {
	Frame          int        `json:"frame"`
	FrameKey       string     `json:"frame_key"`
	State          FrameState `json:"state"`
	TilesTotal     int        `json:"tiles_total"`
	TilesCompleted int        `json:"tiles_completed"`
	TilesFailed    int        `json:"tiles_failed"`
	SamplesTotal   int64      `json:"samples_total"` // tiles_total x spp
	SamplesDone    int64      `json:"samples_done"`  // completed tiles whole, tiles in progress as reported ("Progress")
	Error          string     `json:"error,omitempty"`
	// RenderSeconds is the sum of its completed tiles' render times as their workers reported
	// them: display data, 0 while none is known.
	RenderSeconds float64 `json:"render_seconds,omitempty"`
}

// Status is where a job stands. It is what `status --json` prints.
type Status struct {
	JobID        string   `json:"job_id"`
	State        JobState `json:"state"`
	Scene        string   `json:"scene"`
	SceneVersion string   `json:"scene_version"`
	Camera       string   `json:"camera"`
	Formats      []string `json:"formats"`
	FirstFrame   int      `json:"first_frame"`
	LastFrame    int      `json:"last_frame"`
	FrameStep    int      `json:"frame_step,omitempty"` // the distance between the job's frames when more than 1
	// PreviewFrames are the frames rendered first (submit --preview), and PreviewDone says
	// whether all of them are completed.
	PreviewFrames    []int `json:"preview_frames,omitempty"`
	PreviewDone      bool  `json:"preview_done,omitempty"`
	FramesTotal      int   `json:"frames_total"`
	FramesCompleted  int   `json:"frames_completed"`
	FramesFailed     int   `json:"frames_failed"`
	TilesTotal       int   `json:"tiles_total"`
	TilesCompleted   int   `json:"tiles_completed"`
	TilesFailed      int   `json:"tiles_failed"`
	TileAttempts     int   `json:"tile_attempts"`
	SamplesRecovered int   `json:"samples_recovered"`
	SamplesTotal     int64 `json:"samples_total"` // the frames' sums: they move while a long tile renders
	SamplesDone      int64 `json:"samples_done"`
	Priority         int   `json:"priority"`
	// Created is when the job was submitted.
	Created time.Time `json:"created"`
	// ETASeconds is the estimated time left, from the samples per second measured over the
	// last minute; absent while unknown (too early, nothing moving) and once the job ended.
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
	// BlocklistedWorkers are the live workers that no longer take this job's tiles.
	BlocklistedWorkers []string `json:"blocklisted_workers,omitempty"`
	// Build is the renderer build that renders the job (a Blender's fingerprint, or tilefarm's
	// own for a JSON scene), Requires the tags its workers must carry, MaxSlots its limit on
	// tiles rendering at once.
	Build    string   `json:"build,omitempty"`
	Requires []string `json:"requires,omitempty"`
	MaxSlots int      `json:"max_slots,omitempty"`
	// After and AfterFrames are the jobs the job waits for (submit --after, --after-frames).
	After       []string `json:"after,omitempty"`
	AfterFrames string   `json:"after_frames,omitempty"`
	// Pool describes the workers that may render the job. WaitingFor says what the job waits
	// for while it is unfinished: jobs or frames of jobs not completed yet, or a live worker of
	// its pool when none is. BlockedReason says which job it waits for failed or was cancelled.
	Pool          string        `json:"pool"`
	WaitingFor    string        `json:"waiting_for,omitempty"`
	BlockedReason string        `json:"blocked_reason,omitempty"`
	Frames        []FrameStatus `json:"frames"`
	Failures      []string      `json:"failures,omitempty"`
	// Movie is the job's preview movie (GET /v1/jobs/{id}/movie).
	Movie Movie `json:"movie"`
	// Filled in by clients for one request: tiles rendered by it and tiles already completed before it.
	TilesRendered int      `json:"tiles_rendered"`
	TilesReused   int      `json:"tiles_reused"`
	Outputs       []string `json:"outputs"`

	// Notify are the job's own webhook receivers, without user information or query (which may
	// hold credentials); NotifyFrames says it asked for frame events.
	Notify       []string `json:"notify,omitempty"`
	NotifyFrames bool     `json:"notify_frames,omitempty"`
}
