package coordinator

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/failure"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// watchDeadLetters settles the messages the queue gave up on after MaxDeliver deliveries.
func (c *Coordinator) watchDeadLetters(ctx context.Context) error {
	return c.queue.WatchDeadLetters(ctx, c.nc, deadLetters{c})
}

// deadLetters is the coordinator's queue.DeadLetterHandler: a message whose work is promoted
// is recorded as done, never as failed; any other is recorded as dead-lettered, through the
// projection like every other change, ordered after every delivery of its message.
type deadLetters struct{ c *Coordinator }

func (d deadLetters) Promoted(ctx context.Context, dl api.DeadLetter) (bool, error) {
	switch {
	case queue.IsRenderSubject(dl.Subject):
		var job wire.TileJob
		if json.Unmarshal(dl.Data, &job) != nil {
			return false, nil
		}
		done, err := finalize.ManifestExists(ctx, d.c.objects, layout.TileManifestKey(job.FrameKey, job.TileKey))
		if err != nil || !done {
			return false, err
		}
		return true, d.c.update(ctx, func(p *projection) error {
			return ignoreUnknown(p.tileChecked(job.FrameKey, job.TileKey, job.Index, tileUpdate{Index: job.Index, Change: coorddb.TileDone}))
		})
	case dl.Subject == queue.SubjectAssemble:
		var job wire.AssembleJob
		if json.Unmarshal(dl.Data, &job) != nil {
			return false, nil
		}
		done, err := d.c.formatsPromoted(ctx, job.FrameKey, job.Formats)
		if err != nil || !done {
			return false, err
		}
		return true, d.c.update(ctx, func(p *projection) error {
			return ignoreUnknown(p.formatsDone(job.FrameKey, job.Formats))
		})
	}
	return false, nil
}

// Record records a dead letter through the projection, which counts it in
// tilefarm_dead_letters_total when it changes a tile or frame; one that names neither is
// counted here, as nothing else would.
func (d deadLetters) Record(ctx context.Context, dl api.DeadLetter) error {
	undecodable := func() error {
		d.c.m.DeadLetters.WithLabelValues(metrics.DeadLetterUndecodable).Inc()
		return nil // nothing to record
	}
	failure := coorddb.Failure{Code: failure.CodeMaxDeliveries, Delivery: dl.Deliveries, Time: d.c.now(),
		Error: fmt.Sprintf("dead-lettered after %d deliveries: %s", dl.Deliveries, dl.Reason)}
	switch {
	case queue.IsRenderSubject(dl.Subject):
		var job wire.TileJob
		if json.Unmarshal(dl.Data, &job) != nil {
			return undecodable()
		}
		return d.c.update(ctx, func(p *projection) error {
			return ignoreUnknown(p.tileChecked(job.FrameKey, job.TileKey, job.Index, tileUpdate{Index: job.Index,
				Change: coorddb.TileDeadLetter, Order: coorddb.DeadLetterOrder(dl.StreamSeq), Failure: &failure}))
		})
	case dl.Subject == queue.SubjectAssemble:
		var job wire.AssembleJob
		if json.Unmarshal(dl.Data, &job) != nil {
			return undecodable()
		}
		return d.c.update(ctx, func(p *projection) error {
			return ignoreUnknown(p.assemblyFailed(job.FrameKey, job.Formats, failure.Error))
		})
	}
	return undecodable()
}

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

// RequeueDeadLetter puts a dead letter back on the queue and records it: a tile goes back to
// queued, an assembly is awaited again.
func (c *Coordinator) RequeueDeadLetter(ctx context.Context, dlqSeq uint64) error {
	dl, err := c.queue.RequeueDeadLetter(ctx, dlqSeq)
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
		case dl.Subject == queue.SubjectAssemble:
			var job wire.AssembleJob
			if json.Unmarshal(dl.Data, &job) != nil {
				return nil
			}
			return ignoreUnknown(p.assemblyRequeued(job.FrameKey, job.Formats))
		}
		return nil
	})
}
