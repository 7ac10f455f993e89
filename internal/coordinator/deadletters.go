package coordinator

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// formatsPromoted reports whether every format of a frame has its manifest.
func (c *Coordinator) formatsPromoted(ctx context.Context, frameKey string, formats []string) (bool, error) {
	for _, f := range formats {
		done, err := finalize.ManifestExists(ctx, c.objects, layout.FrameManifestKey(frameKey, f))
		if err != nil || !done {
			return false, err
		}
	}
	return len(formats) > 0, nil
}

// DeadLetter returns the dead letter at DLQ sequence dlqSeq with what the farm knows of its
// work: a tile's job, frame and index with the tile's recorded failed attempts and their logs,
// or an assembly's frame (docs/web.md, "Dead letters").
func (c *Coordinator) DeadLetter(ctx context.Context, dlqSeq uint64) (api.DeadLetterDetail, error) {
	dl, err := c.queue.DeadLetter(ctx, dlqSeq)
	if err != nil {
		return api.DeadLetterDetail{}, err
	}
	out := api.DeadLetterDetail{DeadLetter: dl, Failures: []api.TileFailure{}}
	switch {
	case queue.IsRenderSubject(dl.Subject):
		var job wire.TileJob
		if json.Unmarshal(dl.Data, &job) != nil || !validHash(job.FrameKey) {
			return out, nil
		}
		index := job.Index
		out.Kind, out.JobID, out.FrameKey, out.Frame, out.TileIndex, out.TileKey = "tile", job.JobID, job.FrameKey, job.Frame, &index, job.TileKey
		err := c.db.View(ctx, func(tx *coorddb.Tx) error {
			list, err := tx.TileFailures(job.FrameKey, job.Index)
			out.Failures = apiFailures(list)
			return err
		})
		return out, err
	case queue.IsAssembleSubject(dl.Subject):
		var job wire.AssembleJob
		if json.Unmarshal(dl.Data, &job) == nil {
			out.Kind, out.JobID, out.FrameKey, out.Frame = "assembly", job.JobID, job.FrameKey, job.Frame
		}
	}
	return out, nil
}

// RequeueDeadLetter puts a dead letter back on the queue and records it: a tile goes back to
// queued, an assembly or a movie is awaited again.
func (c *Coordinator) RequeueDeadLetter(ctx context.Context, dlqSeq uint64) error {
	dl, err := c.queue.RequeueDeadLetter(ctx, dlqSeq, queue.RequeueTo(c.requeueSubject))
	if err != nil {
		return err
	}
	return c.update(ctx, func(p *projection) error {
		switch {
		case queue.IsRenderSubject(dl.Subject):
			var job wire.TileJob
			if json.Unmarshal(dl.Data, &job) != nil {
				return nil
			}
			return ignoreUnknown(p.tileChecked(job.FrameKey, job.TileKey, job.Index, tileUpdate{Index: job.Index, Change: coorddb.TileRequeued}))
		case queue.IsAssembleSubject(dl.Subject) && wire.IsMovieJob(dl.Data):
			var job wire.MovieJob
			if json.Unmarshal(dl.Data, &job) != nil {
				return nil
			}
			return ignoreUnknown(p.movieChange(job.JobID, coorddb.MovieRequeued, ""))
		case queue.IsAssembleSubject(dl.Subject):
			var job wire.AssembleJob
			if json.Unmarshal(dl.Data, &job) != nil {
				return nil
			}
			return ignoreUnknown(p.assemblyRequeued(job.FrameKey, job.Formats))
		}
		return nil
	})
}

// requeueSubject is where a requeued dead tile goes: where its frame's tiles go now (its pool
// made anew if it was retired since, dispatch.go); another dead letter goes back where it was.
func (c *Coordinator) requeueSubject(ctx context.Context, dl api.DeadLetter) (string, error) {
	var job wire.TileJob
	if !queue.IsRenderSubject(dl.Subject) || json.Unmarshal(dl.Data, &job) != nil {
		return "", nil
	}
	var to target
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		f, err := tx.Frame(job.FrameKey)
		if err != nil {
			return err
		}
		jobs, err := frameJobs(f, tx.Job)
		if err != nil {
			return err
		}
		j, err := tx.Job(job.JobID)
		if errors.Is(err, coorddb.ErrNotFound) {
			j, err = nil, nil
		}
		to = frameTarget(f, jobs, j, 0)
		return err
	})
	if errors.Is(err, coorddb.ErrNotFound) {
		return "", nil // a frame this coordinator does not know: where it was
	}
	if err != nil {
		return "", err
	}
	if err := c.queue.EnsurePool(ctx, to.pool); err != nil {
		return "", err
	}
	return to.subject(), nil
}
