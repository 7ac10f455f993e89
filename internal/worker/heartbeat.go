package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/queue"
)

// heartbeat keeps a message (and, for tiles, its lease) alive while the worker holds it:
// every Heartbeat it extends the ack-wait with InProgress and renews the lease by CAS. A lost
// lease cancels ctx at once. The lease is only touched under mu, because a renewal changes
// its fencing token.
type heartbeat struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	leases *queue.Leases
	lease  *queue.Lease // nil for work that needs no lease (assembly)

	mu      sync.Mutex
	stopped chan struct{}
	done    chan struct{}
	once    sync.Once
	lost    error
}

func (w *Worker) startHeartbeat(ctx context.Context, msg jetstream.Msg, lease *queue.Lease, log *slog.Logger) *heartbeat {
	hctx, cancel := context.WithCancelCause(ctx)
	hb := &heartbeat{ctx: hctx, cancel: cancel, leases: w.queue.Leases, lease: lease,
		stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(hb.done)
		t := time.NewTicker(w.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-hb.stopped:
				return
			case <-hctx.Done():
				return
			case <-t.C:
			}
			if err := msg.InProgress(); err != nil {
				log.Warn("extending ack-wait", "err", err)
			}
			if lease == nil {
				continue
			}
			hb.mu.Lock()
			err := hb.leases.Renew(hctx, lease)
			hb.mu.Unlock()
			if errors.Is(err, queue.ErrLeaseLost) {
				w.m.LeaseRenewalFailures.Inc()
				cancel(err)
				return
			}
			if err != nil {
				log.Warn("renewing lease", "err", err)
			}
		}
	}()
	return hb
}

// check is the fencing check before finalize: the lease must still be ours.
func (hb *heartbeat) check(ctx context.Context) error {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.leases.Check(ctx, hb.lease)
}

// stop ends the heartbeat and reports whether the lease was lost; it is safe to call twice.
func (hb *heartbeat) stop() error {
	hb.once.Do(func() {
		close(hb.stopped)
		<-hb.done
		if cause := context.Cause(hb.ctx); errors.Is(cause, queue.ErrLeaseLost) {
			hb.lost = cause
		}
		hb.cancel(nil)
	})
	return hb.lost
}
