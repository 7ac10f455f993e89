package api

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Exit codes of the command contract (docs/operations.md): scripts and cron jobs rely on them.
const (
	ExitOK         = 0
	ExitFailed     = 1
	ExitUsage      = 2
	ExitInProgress = 3
	ExitQueued     = 42
	ExitBusy       = 75
	ExitInterrupt  = 130
)

// ErrorKind names a class of errors on the wire: the kind of every error body.
type ErrorKind string

// Error is one entry of the catalogue: a class of errors with its kind on the wire, the HTTP
// status the coordinator answers it with and the exit code a command ends with. Errors of the
// farm wrap an entry (check with errors.Is); several entries may share a kind.
type Error struct {
	Kind   ErrorKind
	Status int
	Exit   int
	msg    string
}

func (e *Error) Error() string { return e.msg }

// The catalogue.
var (
	// ErrBadInput marks a request that can never succeed as given.
	ErrBadInput = &Error{Kind: "bad_input", Status: 400, Exit: ExitFailed, msg: "bad input"}
	// ErrConflict is an idempotency key reused with a different payload, or an operation the
	// job's state refuses.
	ErrConflict = &Error{Kind: "conflict", Status: 409, Exit: ExitFailed, msg: "conflict"}
	// ErrNoTilePNG is asked for the PNG of a tile of a scene whose PNGs only its renderer's
	// colour management can encode, from the whole frame.
	ErrNoTilePNG = &Error{Kind: "conflict", Status: 409, Exit: ExitFailed,
		msg: "its tiles have no PNG of their own, since Blender's colour management encodes its PNG"}
	// ErrNotFound is a job, frame, scene, dead letter or object that does not exist.
	ErrNotFound = &Error{Kind: "not_found", Status: 404, Exit: ExitFailed, msg: "not found"}
	// ErrNotReady is an output of a frame that is not completed yet.
	ErrNotReady = &Error{Kind: "not_ready", Status: 409, Exit: ExitFailed, msg: "frame not completed yet"}
	// ErrMovieNotReady is the preview movie of a job asked for before it is ready: its job is
	// still rendering or a worker is encoding it. 404 as a resource that does not exist yet,
	// exit 3 as a job in progress.
	ErrMovieNotReady = &Error{Kind: "movie_not_ready", Status: 404, Exit: ExitInProgress, msg: "preview movie not ready yet"}
	// ErrTileNotReady is the PNG of a tile that is not completed yet.
	ErrTileNotReady = &Error{Kind: "not_ready", Status: 409, Exit: ExitFailed, msg: "tile not completed yet"}
	// ErrNoWorker is a job no live worker can render: none runs its renderer build or carries
	// the tags it requires. Its message lists the live workers' pools.
	ErrNoWorker = &Error{Kind: "no_worker", Status: 409, Exit: ExitFailed, msg: "no live worker can render this job"}
	// ErrBusy is the farm refusing new work for now: retry later (a BusyError says when).
	ErrBusy = &Error{Kind: "busy", Status: 429, Exit: ExitBusy, msg: "farm busy: too much work queued, retry later"}
	// ErrUnauthorized is a missing or wrong API token.
	ErrUnauthorized = &Error{Kind: "unauthorized", Status: 401, Exit: ExitFailed, msg: "unauthorized"}
	// ErrCorrupt is stored data that no longer matches its manifest.
	ErrCorrupt = &Error{Kind: "corrupt", Status: 500, Exit: ExitFailed, msg: "object corrupt"}
	// ErrUnavailable is a coordinator that could not be reached; retrying later may work.
	ErrUnavailable = &Error{Kind: "unavailable", Status: 503, Exit: ExitBusy, msg: "coordinator unavailable"}
	// ErrNotLeader is a write asked of a coordinator that does not lead the farm: retry on the
	// leader (a NotLeaderError names it) or another address.
	ErrNotLeader = &Error{Kind: "not_leader", Status: 503, Exit: ExitBusy, msg: "this coordinator does not lead the farm"}
	// ErrInternal is everything else: the coordinator's own failure.
	ErrInternal = &Error{Kind: "internal", Status: 500, Exit: ExitFailed, msg: "internal error"}
)

// catalogue lists every entry; the first of a kind is the one a client rebuilds it as.
var catalogue = []*Error{ErrBadInput, ErrConflict, ErrNoTilePNG, ErrNotFound, ErrNotReady, ErrTileNotReady,
	ErrBusy, ErrUnauthorized, ErrCorrupt, ErrUnavailable, ErrInternal, ErrNoWorker, ErrMovieNotReady, ErrNotLeader}

// Classify returns the catalogue entry err wraps, or nil for an error outside the catalogue.
func Classify(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// OfKind returns the catalogue's entry for a kind received on the wire, nil for an unknown kind.
func OfKind(kind ErrorKind) *Error {
	for _, e := range catalogue {
		if e.Kind == kind {
			return e
		}
	}
	return nil
}

// ExitCode is the exit code of a command that ended with err: 0 for none, 130 for an
// interrupt, the catalogue's code for an error of the API and 1 for anything else.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, context.Canceled):
		return ExitInterrupt
	}
	if e := Classify(err); e != nil {
		return e.Exit
	}
	return ExitFailed
}

// BusyError is ErrBusy with when to retry: the farm has as many tiles pending as it takes.
// The coordinator fills in the counts; a client, which receives only the coordinator's words
// and a Retry-After, has them in Message.
type BusyError struct {
	Pending, Adding, Limit int
	RetryAfter             time.Duration
	Message                string
}

func (e *BusyError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("farm busy: %d tiles pending and %d more submitted exceed the limit of %d pending tiles; retry in %s",
		e.Pending, e.Adding, e.Limit, e.RetryAfter)
}

// Unwrap makes a BusyError an ErrBusy.
func (e *BusyError) Unwrap() error { return ErrBusy }

// NotLeaderError is ErrNotLeader with the address of the coordinator that leads, if one does.
type NotLeaderError struct {
	Leader string // the leader's HTTP address; "" while none leads (an election in progress)
}

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "this coordinator does not lead the farm and no coordinator leads it yet (an election takes up to the lease TTL); retry in a second"
	}
	return "this coordinator does not lead the farm; the leader is " + e.Leader
}

// Unwrap makes a NotLeaderError an ErrNotLeader.
func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Error string    `json:"error"`
	Kind  ErrorKind `json:"kind"` // bad_input, conflict, busy, not_found, not_ready, movie_not_ready, unauthorized, corrupt, not_leader, internal
	// Leader is where the farm's leader answers, on a not_leader error.
	Leader string `json:"leader,omitempty"`
}
