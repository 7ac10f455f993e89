package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/queue"
)

// heartbeat keeps a message (and, for tiles, its lease) alive while the worker holds it:
// every Heartbeat it extends the ack-wait with InProgress and renews the lease by CAS. A lost
// lease cancels ctx at once, and so does the lease's TTL passing on this worker's clock since
// the last renewal that succeeded (counted from when it was sent): a worker cut off from NATS
// stops rendering a tile that may already be another's, whatever the network says. A renewal
// may wait for its answer until then. The lease is only touched under mu, because a renewal
// changes its fencing token.
type heartbeat struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	leases *queue.Leases
	lease  *queue.Lease // nil for work that needs no lease (assembly)

	mu      sync.Mutex
	quit    context.CancelFunc // ends a renewal in flight when the heartbeat stops
	stopped chan struct{}
	done    chan struct{}
	once    sync.Once
	lost    error
}

func (w *Worker) startHeartbeat(ctx context.Context, msg jetstream.Msg, lease *queue.Lease, log *slog.Logger) *heartbeat {
	hctx, cancel := context.WithCancelCause(ctx)
	lctx, quit := context.WithCancel(hctx)
	hb := &heartbeat{ctx: hctx, cancel: cancel, leases: w.queue.Leases, lease: lease, quit: quit,
		stopped: make(chan struct{}), done: make(chan struct{})}
	var expiry *time.Timer
	var expiresAt time.Time // when the lease lapses on this worker's clock
	if lease != nil {
		ttl := w.queue.Leases.TTL()
		expiresAt = time.Now().Add(ttl)
		expiry = time.AfterFunc(ttl, func() {
			w.m.LeaseRenewalFailures.Inc()
			log.Warn("lease expired on this worker's clock: no renewal succeeded for its TTL; stopping the tile", "ttl", ttl)
			cancel(fmt.Errorf("%w: not renewed for the lease TTL %v", queue.ErrLeaseLost, ttl))
		})
	}
	go func() {
		defer close(hb.done)
		if expiry != nil {
			defer expiry.Stop()
		}
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
			// The renewal may take until the lease lapses: on a busy server an answer slower than
			// a heartbeat is still worth having (and one that never comes is adopted next time).
			sent := time.Now()
			hb.mu.Lock()
			rctx, rcancel := context.WithDeadline(lctx, expiresAt)
			err := hb.leases.Renew(rctx, lease)
			rcancel()
			hb.mu.Unlock()
			if err == nil && hctx.Err() == nil {
				// The server wrote the renewal after it was sent: the lease lives at least a TTL
				// from then.
				expiresAt = sent.Add(hb.leases.TTL())
				expiry.Reset(time.Until(expiresAt))
			}
			if errors.Is(err, queue.ErrLeaseLost) {
				w.m.LeaseRenewalFailures.Inc()
				cancel(err)
				return
			}
			if err != nil && lctx.Err() == nil {
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
		hb.quit()
		close(hb.stopped)
		<-hb.done
		if cause := context.Cause(hb.ctx); errors.Is(cause, queue.ErrLeaseLost) {
			hb.lost = cause
		}
		hb.cancel(nil)
	})
	return hb.lost
}
