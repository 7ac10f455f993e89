package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/store"
)

// ErrBusy is returned when the farm refuses new work for now (exit code 75: retry later).
var ErrBusy = errors.New("farm busy: too much work queued, retry later")

// Config tunes a coordinator.
type Config struct {
	// MaxQueued is the TILES depth above which submissions are refused with ErrBusy; 0 means no limit.
	MaxQueued uint64
	// Faults are crash hooks for fault tests.
	Faults Faults
}

// Faults name seams at which a coordinator kills itself with SIGKILL, so crash tests hit the
// exact window DESIGN.md worries about in a real process.
type Faults struct {
	// CrashBeforePublish: after reading an outbox record, before publishing it.
	CrashBeforePublish bool
	// CrashAfterPublish: after the PubAck, before deleting the outbox record.
	CrashAfterPublish bool
	// Crash is called at a seam; the command sets it to kill the process.
	Crash func(seam string)
}

// Coordinator is the farm's brain. Create with New, then Run.
type Coordinator struct {
	cfg     Config
	store   *store.Store
	farm    *queue.Farm
	nc      *nats.Conn
	objects finalize.Store
	m       *metrics.Metrics
	log     *slog.Logger
	now     func() time.Time

	relayKick chan struct{}
	changedMu sync.Mutex
	changed   chan struct{} // closed and replaced on every projection change, for waiters
}

// New wires a coordinator.
func New(cfg Config, st *store.Store, f *queue.Farm, nc *nats.Conn, objects finalize.Store, m *metrics.Metrics, log *slog.Logger) *Coordinator {
	return &Coordinator{
		cfg: cfg, store: st, farm: f, nc: nc, objects: objects, m: m, log: log,
		now:       func() time.Time { return time.Now().UTC() },
		relayKick: make(chan struct{}, 1),
		changed:   make(chan struct{}),
	}
}

// Run runs the outbox relay, the event consumer, the dead-letter watcher and the metrics
// sampler until ctx is done. Each restarts after an error, so a NATS outage heals by itself.
func (c *Coordinator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	loops := map[string]func(context.Context) error{
		"outbox relay":        c.relay,
		"event consumer":      c.consumeEvents,
		"dead-letter watcher": c.watchDeadLetters,
		"metrics sampler":     c.sampleMetrics,
	}
	for name, loop := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := loop(ctx); err != nil && ctx.Err() == nil {
					c.log.Error("coordinator loop failed; restarting", "loop", name, "err", err)
					queue.Sleep(ctx, time.Second)
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

func (c *Coordinator) kickRelay() {
	select {
	case c.relayKick <- struct{}{}:
	default:
	}
}

// notify wakes everyone waiting for a projection change.
func (c *Coordinator) notify() {
	c.changedMu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.changedMu.Unlock()
}

// Changed returns a channel closed at the next projection change.
func (c *Coordinator) Changed() <-chan struct{} {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	return c.changed
}

func (c *Coordinator) backpressure(ctx context.Context) bool {
	if c.cfg.MaxQueued == 0 {
		return false
	}
	depth, _, err := c.farm.Depth(ctx)
	return err == nil && depth > c.cfg.MaxQueued
}

func (c *Coordinator) sampleMetrics(ctx context.Context) error {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	var lastPrune time.Time
	for {
		depth, oldest, err := c.farm.Depth(ctx)
		if err == nil {
			c.m.QueueDepth.Set(float64(depth))
			c.m.OldestMessageAge.Set(oldest.Seconds())
		}
		if n, err := c.store.OutboxLen(ctx); err == nil {
			c.m.OutboxPending.Set(float64(n))
		}
		if time.Since(lastPrune) > time.Hour {
			lastPrune = time.Now()
			// EVENTS keeps a week of history; markers of events older than that can go.
			if n, err := c.store.PruneEvents(ctx, c.now().Add(-queue.EventsRetention-24*time.Hour)); err != nil {
				c.log.Warn("pruning applied event ids", "err", err)
			} else if n > 0 {
				c.log.Info("pruned applied event ids", "count", n)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
