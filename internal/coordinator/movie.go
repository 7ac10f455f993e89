package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// The preview movie of a job (docs/design.md, "Preview movie"): asked for in the transaction
// that completes the job, relayed to the assembly subjects of the job's pool, encoded by a
// worker and believed once its manifest is found. The movie is an extra: no state of it
// changes the job's.

// MovieFPS is the frame rate of every preview movie: the farm does not know a scene's own
// rate yet (a .blend's would be a field of its description, which is in the scene version).
const MovieFPS = 24

// MovieMsgID is the dedup id of a job's movie request: a job asks once, and a republished
// request within the dedup window is dropped.
func MovieMsgID(jobID string) string { return "movie:" + jobID }

// maxMovieError bounds the reason a failed movie keeps, as a tile failure's is bounded.
const maxMovieError = 1024

// moviesDue asks for the movie of every job one of the projection's frames completed: a frame
// that became completed in a job's formats in this transaction (its Done now holds them, and
// did not when it was loaded) makes flush check its jobs. So a job's completion is found in
// the transaction that completes it, and a job completed before (an older farm's, or one whose
// frame another job touches) is never asked again.
func (p *projection) moviesDue() error {
	checked := map[string]bool{}
	for _, fk := range p.order {
		e := p.frames[fk]
		if !e.dirty || len(e.f.Done) == 0 {
			continue
		}
		for _, id := range e.f.JobIDs {
			if checked[id] {
				continue
			}
			j, err := p.job(id)
			if errors.Is(err, coorddb.ErrNotFound) {
				continue // the job this transaction submits: Submit asks for its movie itself
			}
			if err != nil {
				return err
			}
			if !e.completedFor(j) {
				continue
			}
			checked[id] = true
			if err := p.movieIfCompleted(j); err != nil {
				return err
			}
		}
	}
	return nil
}

// movieIfCompleted asks for j's movie if j wants one, has not asked yet and is completed.
func (p *projection) movieIfCompleted(j *coorddb.Job) error {
	if j.NoMovie || j.Movie != coorddb.MovieNone {
		return nil
	}
	done, err := p.jobDone(j)
	if err != nil || !done {
		return err
	}
	return p.requestMovie(j)
}

// requestMovie records j's movie asked for and adds its outbox record, in the projection's
// transaction.
func (p *projection) requestMovie(j *coorddb.Job) error {
	next, changed := coorddb.NextMovieState(j.Movie, coorddb.MovieRequested)
	if !changed {
		return nil
	}
	j.Movie = next
	p.markJob(j)
	return p.tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxMovie, JobID: j.ID, Priority: j.Priority})
}

// movieChange applies a change of job id's movie: a movie.ready whose manifest was found
// (done), a dead-lettered encoding (dead letter, with why), a requeue.
func (p *projection) movieChange(id string, ch coorddb.MovieChange, reason string) error {
	j, err := p.job(id)
	if err != nil {
		return err
	}
	next, changed := coorddb.NextMovieState(j.Movie, ch)
	if !changed {
		return nil
	}
	j.Movie, j.MovieError = next, ""
	if next == coorddb.MovieFailed {
		if len(reason) > maxMovieError {
			reason = reason[:maxMovieError]
		}
		j.MovieError = reason
	}
	p.markJob(j)
	return nil
}

// movieMessages derives the message of a movie record: the job's MovieJob on the assembly
// subject of its pool. A record of a job since forgotten has none.
func (c *Coordinator) movieMessages(ctx context.Context, r coorddb.OutboxRecord) ([]*nats.Msg, error) {
	var j *coorddb.Job
	err := c.db.View(ctx, func(tx *coorddb.Tx) (err error) {
		j, err = tx.Job(r.JobID)
		return err
	})
	if errors.Is(err, coorddb.ErrNotFound) {
		c.log.Warn("movie outbox record for an unknown job; dropping it", "job_id", r.JobID)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	pool := jobPool(j)
	if err := c.queue.EnsurePool(ctx, pool); err != nil {
		return nil, err
	}
	data, err := json.Marshal(wire.MovieJob{Kind: wire.KindMovie, JobID: j.ID, SceneVersion: j.SceneVersion, Camera: j.Camera,
		SettingsHash: j.SettingsHash, First: j.First, Last: j.Last, Step: j.Step,
		Width: j.Settings.Width, Height: j.Settings.Height, FPS: MovieFPS})
	if err != nil {
		return nil, err
	}
	return []*nats.Msg{newMsg(pool.AssembleSubject(), MovieMsgID(j.ID), data)}, nil
}

// moviePromoted reports whether job id's movie has its manifest: a movie.ready is believed
// only then, as a frame.assembled only with its formats' manifests.
func (c *Coordinator) moviePromoted(ctx context.Context, id string) (bool, error) {
	return finalize.ManifestExists(ctx, c.objects, layout.MovieKey(id))
}

// MoviePath is where the API serves job id's movie.
func MoviePath(id string) string { return "/v1/jobs/" + id + "/movie" }

// movieStatus is where j's movie stands, as status shows it; state is the job's.
func movieStatus(j *coorddb.Job, state api.JobState) api.Movie {
	switch {
	case j.Movie == coorddb.MovieReady:
		return api.Movie{State: api.MovieReady, URL: MoviePath(j.ID)}
	case j.Movie == coorddb.MovieFailed:
		return api.Movie{State: api.MovieFailed, Reason: j.MovieError}
	case j.NoMovie:
		return api.Movie{State: api.MovieSkipped, Reason: "submitted with --no-movie"}
	case j.Movie == coorddb.MoviePending:
		return api.Movie{State: api.MoviePending, Reason: "a worker encodes it"}
	case state == api.JobCancelled || state == api.JobFailed:
		return api.Movie{State: api.MovieSkipped, Reason: fmt.Sprintf("the job is %s: a movie is made of a completed job's frames", state)}
	}
	return api.Movie{State: api.MoviePending, Reason: "waiting for the job to complete"}
}

// Movie returns job id's preview movie, read through its manifest and verified. A movie not
// ready yet is api.ErrMovieNotReady; one that failed or was skipped, api.ErrNotFound, saying
// why.
func (c *Coordinator) Movie(ctx context.Context, id string) ([]byte, error) {
	st, err := c.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	switch st.Movie.State {
	case api.MovieReady:
	case api.MoviePending:
		return nil, fmt.Errorf("%w: job %s is %s (%d/%d frames); its movie is pending: %s", api.ErrMovieNotReady, id, st.State,
			st.FramesCompleted, st.FramesTotal, st.Movie.Reason)
	case api.MovieFailed:
		return nil, fmt.Errorf("%w: the preview movie of job %s failed: %s", api.ErrNotFound, id, st.Movie.Reason)
	default:
		return nil, fmt.Errorf("%w: job %s has no preview movie: %s", api.ErrNotFound, id, st.Movie.Reason)
	}
	m, err := finalize.ReadManifest(ctx, c.objects, layout.MovieKey(id))
	if err != nil {
		return nil, fmt.Errorf("reading the manifest of job %s's movie: %w", id, err)
	}
	data, err := finalize.ReadObject(ctx, c.objects, m, layout.MovieName)
	if err != nil {
		return nil, fmt.Errorf("reading job %s's movie: %w", id, err)
	}
	return data, nil
}
