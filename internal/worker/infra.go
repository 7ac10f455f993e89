package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/objstore"
)

// isInfra reports whether err is an outage of the infrastructure (object store or NATS) rather
// than a failure of the job: retried in place for as long as it lasts, never counted against
// the tile's failure budget.
func isInfra(err error) bool {
	if err == nil {
		return false
	}
	if objstore.IsRetryable(err) {
		return true
	}
	for _, e := range []error{nats.ErrTimeout, nats.ErrNoResponders, nats.ErrDisconnected, nats.ErrConnectionReconnecting,
		nats.ErrNoServers, jetstream.ErrNoStreamResponse, jetstream.ErrNoHeartbeat, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	// A cluster electing a leader answers 503 ("JetStream system temporarily unavailable").
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// retryStore runs an object-store operation with retryInPlace and keeps the store's health
// (and so whether the worker takes new work) in step with its outcome.
func (w *Worker) retryStore(ctx context.Context, d *delivery, what string, op func(context.Context) error) error {
	return w.retryInPlace(ctx, d, what, func(ctx context.Context) error {
		err := op(ctx)
		w.store.note(objstore.IsRetryable(err))
		return err
	})
}

// DefaultHandOnAfter is how long a job waits for its infrastructure in place before its worker
// hands it on (errHandOn, Config.HandOnAfter): an outage of everyone's store or NATS is waited
// out by any worker alike, but a worker cut off alone should let another, which may still
// reach them, take over.
const DefaultHandOnAfter = 30 * time.Second

// errHandOn means the job's infrastructure stayed unavailable for HandOnAfter: the worker
// hands the job back (no failure, no delivery spent) for a worker that can reach it.
var errHandOn = errors.New("infrastructure unavailable for too long: handing the job on")

// retryInPlace runs op, retrying in place with backoff while it fails with an infrastructure
// error, for up to Config.HandOnAfter. The message's ack-wait is extended meanwhile, so an outage
// costs the tile neither deliveries nor failures. Only a job error, ctx ending, or the outage
// outlasting Config.HandOnAfter (errHandOn) returns.
func (w *Worker) retryInPlace(ctx context.Context, d *delivery, what string, op func(context.Context) error) error {
	start := time.Now()
	for try := 1; ; try++ {
		err := op(ctx)
		if !isInfra(err) || ctx.Err() != nil {
			if err != nil && try > 1 {
				err = fmt.Errorf("%s: %w", what, err)
			}
			return err
		}
		if time.Since(start) > w.cfg.HandOnAfter {
			return fmt.Errorf("%w: %s: %w", errHandOn, what, err)
		}
		delay := queue.Backoff(try, w.cfg.RetryBase, 8*w.cfg.RetryBase, w.jitter)
		if try == 1 || try%10 == 0 {
			d.log.Warn("infrastructure unavailable; retrying in place", "op", what, "try", try, "delay", delay, "err", err)
		}
		w.m.Retries.WithLabelValues(metrics.RetryInPlace).Inc()
		_ = d.msg.InProgress()
		queue.Sleep(ctx, delay)
	}
}

// storeHealth tracks whether the object store answers. While it does not, the worker's loops
// take no new work (a tile it could not finalize would only hold a lease and burn CPU) and
// the gauge tilefarm_worker_store_available says so.
type storeHealth struct {
	w         *Worker
	mu        sync.Mutex
	available bool
}

// note records the outcome of a store operation: down on a retryable storage error, up on
// anything else.
func (s *storeHealth) note(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.available == !down {
		return
	}
	s.available = !down
	if down {
		s.w.m.StoreAvailable.Set(0)
		s.w.log.Warn("object store unavailable: not taking new work until it answers")
	} else {
		s.w.m.StoreAvailable.Set(1)
		s.w.log.Info("object store available again: taking work")
	}
}

func (s *storeHealth) up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.available
}

// wait returns at once while the store is up; while it is down it probes it with backoff until
// it answers. It reports false when ctx ends first.
func (s *storeHealth) wait(ctx context.Context) bool {
	for try := 1; !s.up(); try++ {
		if !queue.Sleep(ctx, queue.Backoff(try, s.w.cfg.RetryBase, 8*s.w.cfg.RetryBase, s.w.jitter)) {
			return false
		}
		// Any answer but an outage (a missing object included) means the store is back.
		_, err := s.w.objects.Stat(ctx, "health/probe")
		s.note(objstore.IsRetryable(err))
	}
	return ctx.Err() == nil
}
