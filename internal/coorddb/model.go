// Package coorddb is the coordinator's persistence: jobs, frames with their compact tile tables,
// failure details and the transactional outbox, in one bbolt file. A submission writes its job,
// its frames and one outbox record per frame in one transaction: O(frames) records whatever
// the tile count, and a crash can never leave a frame recorded but never dispatched.
package coorddb

import (
	"encoding/binary"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// Job is one submission. Its frames are derived from its range and identities (see FrameKey),
// and its state from its frames (see DeriveJobState).
type Job struct {
	ID             string          `json:"id"`
	IdempotencyKey string          `json:"idempotency_key"`
	PayloadHash    string          `json:"payload_hash"`
	Project        string          `json:"project,omitempty"`
	SceneVersion   string          `json:"scene_version"`
	SceneName      string          `json:"scene_name"`
	Camera         string          `json:"camera"`
	First          int             `json:"first"`
	Last           int             `json:"last"`
	Step           int             `json:"step,omitempty"`    // frames First, First+Step, ... up to Last; 0 or 1 is every frame
	Preview        int             `json:"preview,omitempty"` // frames First, First+Preview, ... and Last render first; 0 is none
	Settings       render.Settings `json:"settings"`
	SettingsHash   string          `json:"settings_hash"`
	TileSize       int             `json:"tile_size"`
	Priority       int             `json:"priority"`
	Formats        []string        `json:"formats"`
	// Requires are the tags a worker must carry to render the job's tiles (sorted).
	Requires []string `json:"requires,omitempty"`
	// MaxSlots is how many of the job's tiles may render at once; 0 is no limit.
	MaxSlots int `json:"max_slots,omitempty"`
	// Build is the renderer build that renders the job: Settings.Build for a renderer whose
	// build is in the frames' identity (Blender), else the built-in renderer's chosen at submit.
	// Empty for a job of an older coordinator: any worker.
	Build   string    `json:"build,omitempty"`
	Created time.Time `json:"created"`
	// Cancelled is when the job was cancelled; zero while it is not.
	Cancelled time.Time `json:"cancelled,omitzero"`
	// Failed says why the farm gave up on the job as a whole (every live worker blocklisted
	// it); empty while it has not. Its frames' own failures are in the frames.
	Failed string `json:"failed,omitempty"`
	// Notify are the job's own webhook receivers (submit --notify), on top of the farm-wide
	// ones; NotifyFrames asks for an event per frame as well (docs/design.md, "Notifications").
	// Like tags, they are outside the payload hash.
	Notify       []string `json:"notify,omitempty"`
	NotifyFrames bool     `json:"notify_frames,omitempty"`
	// After are the jobs (sorted) that must complete before any frame of this one is
	// dispatched; AfterFrames is a job whose frame N must complete before this job's frame N
	// is (a frame it lacks waits for the whole job). Both are fixed at submit and name only
	// jobs older than this one (docs/design.md, "Jobs that wait for jobs").
	After       []string `json:"after,omitempty"`
	AfterFrames string   `json:"after_frames,omitempty"`
	// NoMovie skips the job's preview movie (submit --no-movie); Movie is where the movie
	// stands and MovieError why it failed (docs/design.md, "Preview movie"). Outside the
	// payload hash: the movie is an extra, made of the frames the payload decides.
	NoMovie    bool       `json:"no_movie,omitempty"`
	Movie      MovieState `json:"movie,omitempty"`
	MovieError string     `json:"movie_error,omitempty"`
}

// Upstream lists every job this one waits for: After, then AfterFrames if it is not among them.
func (j *Job) Upstream() []string {
	up := slices.Clone(j.After)
	if j.AfterFrames != "" && !slices.Contains(up, j.AfterFrames) {
		up = append(up, j.AfterFrames)
	}
	return up
}

// State is the job's state given its frames' states as it sees them (Frame.StateFor with its
// formats). A cancelled job stays cancelled whatever its frames do for other jobs (only an
// unfinished job can be cancelled), and a job the farm gave up on stays failed unless its
// frames completed after all.
func (j *Job) State(frames []FrameState) JobState {
	s := DeriveJobState(frames)
	switch {
	case !j.Cancelled.IsZero():
		return JobCancelled
	case j.Failed != "" && s != JobCompleted:
		return JobFailed
	}
	return s
}

// FrameKey returns the frame_key of frame n of the job.
func (j *Job) FrameKey(n int) string {
	return identity.FrameKey(j.SceneVersion, j.Camera, n, j.SettingsHash)
}

// Frames is the number of frames the job asks for.
func (j *Job) Frames() int { return (j.Last-j.First)/j.step() + 1 }

// step is the distance between the job's frames: Step, or 1 for a job of every frame.
func (j *Job) step() int { return max(j.Step, 1) }

// FrameNumbers yields the numbers of the job's frames: First, First+Step, ... up to Last.
func (j *Job) FrameNumbers() iter.Seq[int] {
	return func(yield func(int) bool) {
		for n := j.First; n <= j.Last; n += j.step() {
			if !yield(n) {
				return
			}
		}
	}
}

// FrameRange says which frames the job has: "frames 1-24", "frames 1-24, every 2".
func (j *Job) FrameRange() string {
	if j.step() == 1 {
		return fmt.Sprintf("frames %d-%d", j.First, j.Last)
	}
	return fmt.Sprintf("frames %d-%d, every %d", j.First, j.Last, j.step())
}

// PreviewFrames are the job's frames that render first: First, First+Preview, ... and Last,
// those of them that are the job's; none without a preview.
func (j *Job) PreviewFrames() []int {
	if j.Preview <= 0 {
		return nil
	}
	var out []int
	for n := range j.FrameNumbers() {
		if (n-j.First)%j.Preview == 0 || n == j.Last {
			out = append(out, n)
		}
	}
	return out
}

// DispatchOrder yields the job's frames in the order they are dispatched: the preview frames
// first, then the rest, each in frame order.
func (j *Job) DispatchOrder() iter.Seq[int] {
	return func(yield func(int) bool) {
		preview := j.PreviewFrames()
		for _, n := range preview {
			if !yield(n) {
				return
			}
		}
		for n := range j.FrameNumbers() {
			if !slices.Contains(preview, n) && !yield(n) {
				return
			}
		}
	}
}

// HasFrame reports whether frame n is one of the job's.
func (j *Job) HasFrame(n int) bool {
	return n >= j.First && n <= j.Last && (n-j.First)%j.step() == 0
}

// FrameTransition records a change of a frame's state.
type FrameTransition struct {
	State FrameState `json:"state"`
	Error string     `json:"error,omitempty"`
	Time  time.Time  `json:"time"`
}

// maxFrameHistory bounds a frame's history; the newest transitions are kept.
const maxFrameHistory = 16

// Frame is one frame_key, shared by every job that asks for it. Its tiles are derived from its
// size and tile size (tiles.FrameTiles); their states live in its TileTable, and its counters
// here are kept in step with that table by the projection, in the same transaction.
type Frame struct {
	Key          string          `json:"key"`
	Frame        int             `json:"frame"`
	SceneVersion string          `json:"scene_version"`
	Settings     render.Settings `json:"settings"`
	TileSize     int             `json:"tile_size"`
	TilesTotal   int             `json:"tiles_total"`
	// Formats is every output format a job asked for; Done the ones promoted.
	Formats []string `json:"formats"`
	Done    []string `json:"done,omitempty"`
	JobIDs  []string `json:"job_ids"`

	TilesCompleted   int `json:"tiles_completed"`
	TilesFailed      int `json:"tiles_failed"` // dead-lettered now
	TileAttempts     int `json:"tile_attempts"`
	SamplesRecovered int `json:"samples_recovered"`
	SamplesRendered  int `json:"samples_rendered"`
	// RenderMillis is the sum of its completed tiles' render times as their workers reported
	// them (TileTimes): display data, never state.
	RenderMillis int64 `json:"render_ms,omitempty"`

	// AssemblyRequested are the formats the newest assembly request asked for; AssemblyError
	// is set when an assembly was dead-lettered. Assemblies and Retries number the frame's
	// assembly requests and tile retries, so each gets a dedup id of its own.
	AssemblyRequested []string `json:"assembly_requested,omitempty"`
	AssemblyError     string   `json:"assembly_error,omitempty"`
	Assemblies        int      `json:"assemblies,omitempty"`
	Retries           int      `json:"retries,omitempty"`

	// Dropped is set while every job asking for the frame is cancelled: its tiles are not
	// rendered (queue.Dropped tells the workers), until a new job asks for it again.
	Dropped bool `json:"dropped,omitempty"`
	// Held is set while every job asking for the frame waits for other jobs: none of its tiles
	// was ever dispatched. The first of them that may start dispatches it as a new frame
	// (docs/design.md, "Jobs that wait for jobs").
	Held bool `json:"held,omitempty"`

	State   FrameState        `json:"state"`
	Updated time.Time         `json:"updated"`
	History []FrameTransition `json:"history"`
}

// Tiles derives the frame's tiles from its key, size and tile size.
func (f *Frame) Tiles() ([]tiles.FrameTile, error) {
	return tiles.FrameTiles(f.Key, f.Settings.Width, f.Settings.Height, f.TileSize)
}

// StateFor is the frame's state as seen by a job that asked for formats: completed as soon as
// those are promoted, whatever other jobs still wait for.
func (f *Frame) StateFor(formats []string) FrameState {
	switch {
	case HasAll(f.Done, formats):
		return FrameCompleted
	case f.TilesFailed > 0 || f.AssemblyError != "":
		return FrameFailed
	case f.TilesCompleted == f.TilesTotal:
		return FrameAssembling
	case f.TileAttempts > 0 || f.TilesCompleted > 0:
		return FrameRendering
	}
	return FrameQueued
}

// Derive is the frame's own state: with every format any job asked for.
func (f *Frame) Derive() FrameState { return f.StateFor(f.Formats) }

// NeedsAssembly reports whether every tile is completed, some format is not promoted yet and
// no assembly asking for it is pending.
func (f *Frame) NeedsAssembly() bool {
	return f.TilesCompleted == f.TilesTotal && f.AssemblyError == "" && !HasAll(f.Done, f.Formats) &&
		!HasAll(append(slices.Clone(f.Done), f.AssemblyRequested...), f.Formats)
}

// Settle stores the derived state, recording a transition when it changed. It reports
// whether it did.
func (f *Frame) Settle(errText string, now time.Time) bool {
	s := f.Derive()
	if s == f.State && len(f.History) > 0 {
		return false
	}
	f.State, f.Updated = s, now
	f.History = append(f.History, FrameTransition{State: s, Error: errText, Time: now})
	if n := len(f.History) - maxFrameHistory; n > 0 {
		f.History = slices.Delete(f.History, 0, n)
	}
	return true
}

// Terminal reports whether the frame will not change by itself any more.
func (f *Frame) Terminal() bool { return f.State == FrameCompleted || f.State == FrameFailed }

// HasAll reports whether have holds every element of want.
func HasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// TileTable holds the state and causal order of every tile of one frame, indexed like
// tiles.FrameTiles: tileEntrySize bytes per tile, a few KiB for a 1080p frame in 64 px tiles.
type TileTable []byte

// tileEntrySize is one tile's entry: state u8 | order seq u64 | order rank u32, little endian.
const tileEntrySize = 13

// NewTileTable returns the table of a frame of n tiles, every tile queued.
func NewTileTable(n int) TileTable { return make(TileTable, n*tileEntrySize) }

// Len is the number of tiles.
func (t TileTable) Len() int { return len(t) / tileEntrySize }

// Get returns tile i's state and order.
func (t TileTable) Get(i int) (TileState, Order) {
	e := t[i*tileEntrySize : (i+1)*tileEntrySize]
	return TileState(e[0]), Order{Seq: binary.LittleEndian.Uint64(e[1:9]), Rank: binary.LittleEndian.Uint32(e[9:13])}
}

// Set stores tile i's state and order.
func (t TileTable) Set(i int, s TileState, o Order) {
	e := t[i*tileEntrySize : (i+1)*tileEntrySize]
	e[0] = byte(s)
	binary.LittleEndian.PutUint64(e[1:9], o.Seq)
	binary.LittleEndian.PutUint32(e[9:13], o.Rank)
}

// Count returns how many tiles are in state s.
func (t TileTable) Count(s TileState) int {
	n := 0
	for i := 0; i < len(t); i += tileEntrySize {
		if TileState(t[i]) == s {
			n++
		}
	}
	return n
}

func (t TileTable) check(n int) error {
	if len(t) != n*tileEntrySize {
		return fmt.Errorf("tile table has %d bytes, want %d for %d tiles", len(t), n*tileEntrySize, n)
	}
	for i := 0; i < len(t); i += tileEntrySize {
		if t[i] > byte(TileCompleted) {
			return fmt.Errorf("tile table: tile %d has unknown state %d", i/tileEntrySize, t[i])
		}
	}
	return nil
}

// Failure is one failed attempt of a tile. Only failed tiles have any, and each keeps its
// newest maxFailuresPerTile, so failure details stay bounded by the tiles that failed.
type Failure struct {
	Attempt      string    `json:"attempt,omitempty"`
	Worker       string    `json:"worker,omitempty"`
	Code         string    `json:"code"` // error class, see failure.Classify
	Error        string    `json:"error"`
	Delivery     uint64    `json:"delivery,omitempty"`
	DeadLettered bool      `json:"dead_lettered,omitempty"`
	Time         time.Time `json:"time"`
	// Log is the last lines the worker logged about the attempt, its renderer's last output
	// among them, as its failure event quoted them (wire.Event.Log).
	Log []string `json:"log,omitempty"`
}

// Bounds of the failure details.
const (
	maxFailuresPerTile = 4
	maxFailureText     = 1024
	maxFailureLogLines = 20
	maxFailureLogBytes = 4 << 10
)

// OutboxKind says what an outbox record dispatches.
type OutboxKind string

// Outbox record kinds.
const (
	OutboxTiles    OutboxKind = "tiles"    // tile render jobs of one frame
	OutboxAssemble OutboxKind = "assemble" // one assembly of one frame
	OutboxMovie    OutboxKind = "movie"    // the preview movie of one job (JobID; no frame)
	OutboxMove     OutboxKind = "move"     // a frame's tiles not started moved to where its jobs are now (Revive: all not completed)
	OutboxRetire   OutboxKind = "retire"   // pools no frame wanted is dispatched to any more (Pools; no frame)
)

// OutboxRecord is a batch of messages the relay must publish. It names a frame, not its
// messages: the relay derives them from the frame, so a record stays small at any tile count.
type OutboxRecord struct {
	Seq      uint64     `json:"-"`
	Kind     OutboxKind `json:"kind"`
	FrameKey string     `json:"frame_key"`
	JobID    string     `json:"job_id"`
	// Tiles are the tile indices to dispatch; nil means every tile of the frame.
	Tiles []int `json:"tiles,omitempty"`
	// Retry > 0 marks the n-th retry of these tiles; it is part of their message ids.
	Retry int `json:"retry,omitempty"`
	// Assembly is the frame's assembly request number; it is part of the message id.
	Assembly int `json:"assembly,omitempty"`
	// Priority is the priority of the job the tiles are dispatched for: their band when no
	// job wants the frame any more (the frame's jobs pick it otherwise).
	Priority int `json:"priority,omitempty"`
	// First marks the first dispatch of a frame new at submission (wire.TileJob.First).
	First bool `json:"first,omitempty"`
	// Revive marks the move of a frame revived from dropped: every tile not completed moves,
	// and the workers are told the frame is wanted again.
	Revive bool `json:"revive,omitempty"`
	// Pools are the pools a retire record retires, each as its JSON (queue.Pool).
	Pools []string `json:"pools,omitempty"`
	// Tried is set (MarkOutboxTried) before the relay first publishes the record: a record
	// found tried may have its messages in the stream already, from a publish a crash or an
	// error cut short, and tile messages carry no dedup id (docs/design.md, "Dispatch").
	Tried bool `json:"tried,omitempty"`
}
