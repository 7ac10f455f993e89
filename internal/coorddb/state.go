package coorddb

import (
	"fmt"
	"math"
)

// TileState is where one tile stands. It is one byte in its frame's tile table (see TileTable),
// so a frame of any size costs a few bytes per tile, never a record per tile.
type TileState uint8

// Tile states. Leasing and finalizing happen inside one attempt of a worker; the coordinator
// learns of an attempt when it starts (rendering) and when its manifest exists (completed).
const (
	TileQueued          TileState = iota // dispatched (or about to be), no attempt seen yet
	TileRendering                        // an attempt started
	TileFailedRetryable                  // an attempt failed; the queue delivers the tile again
	TileDeadLettered                     // its message left the queue for the DLQ
	TileCompleted                        // its manifest exists: final
)

var tileStateNames = [...]string{"queued", "rendering", "failed_retryable", "dead_lettered", "completed"}

func (s TileState) String() string { return enumName(tileStateNames[:], s, "tile_state") }

// MarshalText makes the state read as its name in JSON.
func (s TileState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// TileChange is something that happened to a tile, reported by an event, the relay (an
// unproven completion), the reconciler or an operator.
type TileChange uint8

// Tile changes.
const (
	TileStarted    TileChange = iota + 1 // a worker holds the lease and renders
	TileFailed                           // an attempt failed and the message will be retried
	TileDeadLetter                       // the message was moved to the DLQ
	TileDone                             // the tile's manifest exists
	TileRequeued                         // a new message was dispatched for a dead-lettered tile
	TileLost                             // its message left the queue unrendered; a new one was dispatched
	TileMoved                            // a new message was dispatched while the old one may still queue (reprioritize, revive)
	TileUnproven                         // recorded completed, but its manifest is not in the store; a new message was dispatched
)

var tileChangeNames = [...]string{"", "started", "failed", "dead_letter", "done", "requeued", "lost", "moved", "unproven"}

func (c TileChange) String() string { return enumName(tileChangeNames[:], c, "tile_change") }

// Order places a change of one tile in causal order: the TILES stream sequence of the message
// it is about, then the rank of the change within that message (delivery, then phase). Every
// redelivery, retry or requeue of a tile is a later sequence or a later delivery, so ordering
// by Order makes the projection independent of the order events are applied in: an event about
// an older message or delivery can never overwrite what a newer one said.
type Order struct {
	Seq  uint64
	Rank uint32
}

// rankDeadLetter is the rank of a dead letter: nothing about the same message comes after it.
const rankDeadLetter = math.MaxUint32

// StartedOrder is the order of an attempt starting on the given delivery of message seq.
func StartedOrder(seq, delivery uint64) Order { return Order{Seq: seq, Rank: clampRank(2 * delivery)} }

// FailedOrder is the order of an attempt failing on the given delivery of message seq; it
// follows the same delivery's start.
func FailedOrder(seq, delivery uint64) Order {
	return Order{Seq: seq, Rank: clampRank(2*delivery + 1)}
}

// DeadLetterOrder is the order of message seq leaving the queue: after every delivery of it.
func DeadLetterOrder(seq uint64) Order { return Order{Seq: seq, Rank: rankDeadLetter} }

func clampRank(r uint64) uint32 { return uint32(min(r, rankDeadLetter-1)) }

// After reports whether o comes strictly after p.
func (o Order) After(p Order) bool {
	return o.Seq > p.Seq || (o.Seq == p.Seq && o.Rank > p.Rank)
}

// NextTileState is the tile state machine, the one place a tile's state changes. Given the
// tile's state and the order of the newest change recorded for it, it returns the state and
// order after ch (made at order ord), and whether either changed.
//
// Rules (docs/design.md, "States"):
//   - done completes a tile from any state, in any order, and completed is final: nothing but
//     unproven moves a completed tile to another state;
//   - unproven turns a completed tile whose manifest the store does not hold back into a
//     queued one, keeping its order (a completion is believed only with its manifest: a
//     forged or mistaken tile.completed cannot skip work);
//   - started, failed and dead_letter apply only when they come after what the tile recorded,
//     so a stale event about an older message or delivery changes nothing. On a completed
//     tile they still advance its order, so an attempt whose start arrives after the
//     reconciler completed the tile is counted once, like any other;
//   - requeued turns a dead-lettered tile back into a queued one; the dead letter's order is
//     kept, so events about the old message stay stale while the new message's are newer;
//   - lost turns a tile neither completed nor dead-lettered back into a queued one and forgets
//     its order: its message is gone, every event about it was applied, and the new message
//     may come from a stream whose sequence went back (one that lost its unsynced tail, or was
//     made anew), so its events must apply whatever their sequence;
//   - moved turns a tile not completed back into a queued one whose order is at least ord, the
//     dead-letter order of the last message the stream held when the new copy was dispatched
//     (MovedOrder): the old copies, which may still queue, deliver and even dead-letter, are
//     all stale, so none can make the tile or its job fail while the new copy is live; the new
//     copy's events (a later sequence) are news.
func NextTileState(cur TileState, curOrder Order, ch TileChange, ord Order) (TileState, Order, bool) {
	switch ch {
	case TileDone:
		return TileCompleted, curOrder, cur != TileCompleted
	case TileRequeued:
		if cur != TileDeadLettered {
			return cur, curOrder, false
		}
		return TileQueued, curOrder, true
	case TileUnproven:
		if cur != TileCompleted {
			return cur, curOrder, false
		}
		return TileQueued, curOrder, true
	case TileLost:
		if cur == TileCompleted || cur == TileDeadLettered {
			return cur, curOrder, false
		}
		return TileQueued, Order{}, cur != TileQueued || curOrder != (Order{})
	case TileMoved:
		if cur == TileCompleted {
			return cur, curOrder, false
		}
		next := curOrder
		if ord.After(next) {
			next = ord
		}
		return TileQueued, next, cur != TileQueued || next != curOrder
	case TileStarted, TileFailed, TileDeadLetter:
		if !ord.After(curOrder) {
			return cur, curOrder, false
		}
		if cur == TileCompleted {
			return cur, ord, true
		}
		next := TileRendering
		switch ch {
		case TileFailed:
			next = TileFailedRetryable
		case TileDeadLetter:
			next = TileDeadLettered
		}
		return next, ord, true
	}
	return cur, curOrder, false
}

// FrameState is where one frame stands. It is derived from the frame's counters (see
// Frame.Derive), so it can never disagree with its tiles.
type FrameState uint8

// Frame states. Waiting and blocked are never a frame's own: they are how a job that waits
// for other jobs sees a frame of its not yet completed (FrameState.Behind).
const (
	FrameQueued     FrameState = iota // no tile started
	FrameRendering                    // tiles started, not all completed
	FrameAssembling                   // every tile completed; formats still to promote
	FrameCompleted                    // every format asked for is promoted
	FrameFailed                       // a tile or the assembly was dead-lettered
	FrameWaiting                      // its job waits for what must complete before it
	FrameBlocked                      // what its job waits for failed or was cancelled
)

var frameStateNames = [...]string{"queued", "rendering", "assembling", "completed", "failed", "waiting", "blocked"}

func (s FrameState) String() string { return enumName(frameStateNames[:], s, "frame_state") }

// MarshalText makes the state read as its name in JSON.
func (s FrameState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state name.
func (s *FrameState) UnmarshalText(b []byte) error {
	return enumParse(frameStateNames[:], b, s, "frame state")
}

// JobState is where a job stands as its artist sees it; it maps onto the exit codes of
// `submit` and `status`.
type JobState uint8

// Job states.
const (
	JobQueued    JobState = iota // nothing started
	JobRendering                 // some frame in progress
	JobCompleted                 // every frame completed in every format the job asked for
	JobFailed                    // every frame finished and one of them failed, or the farm gave up on it
	JobCancelled                 // cancelled before it completed
	JobWaiting                   // nothing to render until the jobs it waits for complete
	JobBlocked                   // every frame finished or blocked, and one is blocked: what it waits for failed or was cancelled
)

var jobStateNames = [...]string{"queued", "rendering", "completed", "failed", "cancelled", "waiting", "blocked"}

func (s JobState) String() string { return enumName(jobStateNames[:], s, "job_state") }

// MarshalText makes the state read as its name in JSON.
func (s JobState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state name.
func (s *JobState) UnmarshalText(b []byte) error {
	return enumParse(jobStateNames[:], b, s, "job state")
}

// enumName is the name of an enumerated value, or kind_N for a value with none.
func enumName[T ~uint8](names []string, v T, kind string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s_%d", kind, v)
}

// enumParse sets *v to the value named b.
func enumParse[T ~uint8](names []string, b []byte, v *T, kind string) error {
	for i, n := range names {
		if n != "" && n == string(b) {
			*v = T(i)
			return nil
		}
	}
	return fmt.Errorf("unknown %s %q", kind, b)
}

// DeriveJobState folds the states of a job's frames (each as seen with the job's own formats,
// and behind what the job waits for, FrameState.Behind) into the job's state. A frame is
// settled when it is completed, failed or blocked: none of those changes without an operator
// or another job. The job is failed or blocked only once every frame settled (failed first:
// its own failure is the nearer cause), waiting while its frames not settled all wait, and
// rendering once any frame got further than queued.
func DeriveJobState(frames []FrameState) JobState {
	completed, failed, blocked, waiting, started := 0, 0, 0, 0, false
	for _, s := range frames {
		switch s {
		case FrameCompleted:
			completed++
		case FrameFailed:
			failed++
		case FrameBlocked:
			blocked++
		case FrameWaiting:
			waiting++
		}
		if s != FrameQueued && s != FrameWaiting && s != FrameBlocked {
			started = true
		}
	}
	settled := completed + failed + blocked
	switch {
	case completed == len(frames):
		return JobCompleted
	case settled == len(frames) && failed > 0:
		return JobFailed
	case settled == len(frames):
		return JobBlocked
	case settled+waiting == len(frames):
		return JobWaiting
	case started:
		return JobRendering
	}
	return JobQueued
}

// DepState is where what one frame of a job waits for stands: every job of its After and, for
// AfterFrames, the same frame of that job (docs/design.md, "Jobs that wait for jobs").
type DepState uint8

// Dependency states, ordered: the state of several dependencies is the latest of theirs (And).
const (
	DepSatisfied DepState = iota // nothing to wait for: the frame may be dispatched
	DepWaiting                   // something it waits for is not completed yet
	DepBlocked                   // something it waits for failed or was cancelled
)

var depStateNames = [...]string{"satisfied", "waiting", "blocked"}

func (d DepState) String() string { return enumName(depStateNames[:], d, "dep_state") }

// And is the state of waiting for both d and e: blocked if either is, else waiting if either
// is.
func (d DepState) And(e DepState) DepState { return max(d, e) }

// DepOnJob is what waiting for a whole job in state s means: satisfied once it completed,
// blocked while it failed, was cancelled or is blocked itself (none of which ends without an
// operator), waiting otherwise.
func DepOnJob(s JobState) DepState {
	switch s {
	case JobCompleted:
		return DepSatisfied
	case JobFailed, JobCancelled, JobBlocked:
		return DepBlocked
	}
	return DepWaiting
}

// DepOnFrame is what waiting for one frame, in state s as its own job sees it, means:
// satisfied once it completed, blocked while it failed or is blocked, waiting otherwise.
func DepOnFrame(s FrameState) DepState {
	switch s {
	case FrameCompleted:
		return DepSatisfied
	case FrameFailed, FrameBlocked:
		return DepBlocked
	}
	return DepWaiting
}

// Behind is frame state s as a job sees it while what its frame waits for stands at d: a
// completed frame is completed whatever it waits for (another job rendered it), a frame
// whose dependency is satisfied shows its own state, and any other waits or is blocked.
func (s FrameState) Behind(d DepState) FrameState {
	switch {
	case s == FrameCompleted || d == DepSatisfied:
		return s
	case d == DepBlocked:
		return FrameBlocked
	}
	return FrameWaiting
}

// MovieState is where a job's preview movie stands (docs/design.md, "Preview movie"). The
// movie is an extra of a completed job: no movie state changes the job's.
type MovieState uint8

// Movie states.
const (
	MovieNone    MovieState = iota // not asked for: the job is not completed (or has no movie)
	MoviePending                   // asked for when the job completed: a worker encodes it
	MovieReady                     // its manifest exists: final
	MovieFailed                    // its encoding was dead-lettered; a requeue asks again
)

var movieStateNames = [...]string{"none", "pending", "ready", "failed"}

func (s MovieState) String() string { return enumName(movieStateNames[:], s, "movie_state") }

// MarshalText makes the state read as its name in JSON.
func (s MovieState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state name.
func (s *MovieState) UnmarshalText(b []byte) error {
	return enumParse(movieStateNames[:], b, s, "movie state")
}

// MovieChange is something that happened to a job's movie.
type MovieChange uint8

// Movie changes.
const (
	MovieRequested  MovieChange = iota + 1 // the job completed: its movie is asked for
	MovieDone                              // the movie's manifest exists
	MovieDeadLetter                        // its encoding was dead-lettered
	MovieRequeued                          // its dead letter went back to the queue
)

// NextMovieState is the movie state machine, the one place a movie's state changes. Rules:
// requested asks only once (from none); done makes any state ready, and ready is final (it is
// applied only once the manifest is found, so nothing is believed without proof); a dead letter
// fails only a pending movie, never a ready one (nothing promoted is ever failed); requeued
// turns a failed movie back into a pending one. It reports whether the state changed.
func NextMovieState(cur MovieState, ch MovieChange) (MovieState, bool) {
	next := cur
	switch ch {
	case MovieRequested:
		if cur == MovieNone {
			next = MoviePending
		}
	case MovieDone:
		next = MovieReady
	case MovieDeadLetter:
		if cur == MoviePending {
			next = MovieFailed
		}
	case MovieRequeued:
		if cur == MovieFailed {
			next = MoviePending
		}
	}
	return next, next != cur
}
