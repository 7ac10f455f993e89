package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// leaderKey is the farm's leadership lease in the leases bucket: one coordinator of a farm
// holds it, renewed well within the lease TTL, its KV revision the token that fences what the
// leader does (docs/design.md, "Leadership"). A coordinator that finds it held by another says
// so and stands by, following the farm's journal ("Replication").
const leaderKey = "coordinator-leader"

// leaderClaim is what the lease holds: who leads and where clients reach it.
type leaderClaim struct {
	ID      string `json:"id"` // the coordinator: its database's (Config.ID), else one run's
	Address string `json:"address,omitempty"`
}

// leadLoop takes the farm's leadership lease when nobody holds it and renews it until ctx is
// done, then gives it up. The lease counts as held only while its last renewal is younger than
// the TTL: a coordinator cut off from JetStream stops counting itself leader within the TTL,
// as the lease expires for the others. tilefarm_coordinator_leader says which coordinator leads.
// While it holds the lease it runs a term (journal.go: caught up, the journal fenced, the
// leader's loops); while it does not, it follows the farm's journal. A term that ends by
// itself (the journal refused a write) is begun again only after the lease was renewed.
func (c *Coordinator) leadLoop(ctx context.Context) error {
	var term, standby *running
	var deafAt time.Time // fault injection: when the loop goes deaf (faults.Plan.DeafLeaderAfter)
	deafDone := false
	leases, ttl := c.queue.Leases, c.queue.Leases.TTL()
	id := c.leaderID
	claim, err := json.Marshal(leaderClaim{ID: id, Address: c.cfg.Address})
	if err != nil {
		return err
	}
	owner := string(claim)
	var lease *queue.Lease
	var renewed time.Time
	var told string // the other leader last logged
	tick := time.NewTicker(max(ttl/4, 10*time.Millisecond))
	defer tick.Stop()
	defer func() {
		_ = standby.stop()
		_ = term.stop() // the leader's loops end before its lease is given up
		c.m.Leader.Set(0)
		if lease != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
			defer cancel()
			if err := leases.Release(rctx, lease); err != nil {
				c.log.Warn("giving up the farm's leadership", "err", err)
			}
		}
	}()
	for {
		switch {
		case lease == nil:
			sent := c.now() // the lease's expiry counts from no earlier than this
			l, err := leases.Acquire(ctx, leaderKey, owner)
			switch {
			case err == nil:
				lease, renewed, told = l, sent, ""
				c.log.Info("leading the farm", "token", l.Token)
			case errors.Is(err, queue.ErrLeaseHeld):
				held, token, oerr := leases.Owner(ctx, leaderKey)
				var other leaderClaim
				_ = json.Unmarshal([]byte(held), &other)
				switch {
				case oerr != nil || held == "":
				case other.ID == id:
					// This coordinator's own lease from before a restart: taken back at once.
					lease = &queue.Lease{Key: leaderKey, Owner: owner, Token: token}
					continue
				case held != told:
					told = held
					c.log.Info("another coordinator leads this farm; standing by, following its journal",
						"leader", other.Address, "leader_id", other.ID)
				}
			case ctx.Err() == nil:
				c.log.Debug("taking the farm's leadership", "err", err)
			}
		default:
			// Counted from before it is sent, and bounded, so a renewal stuck on a link cut
			// off never keeps this coordinator counting itself leader past the lease's expiry.
			sent := c.now()
			rctx, cancel := context.WithTimeout(ctx, max(ttl/4, 10*time.Millisecond))
			err := leases.Renew(rctx, lease)
			cancel()
			switch {
			case err == nil:
				if renewed.IsZero() {
					c.log.Info("leading the farm again after a restart", "token", lease.Token)
				}
				renewed = sent
			case errors.Is(err, queue.ErrLeaseLost):
				c.log.Warn("lost the farm's leadership", "err", err)
				lease = nil
			case ctx.Err() == nil:
				c.log.Debug("renewing the farm's leadership", "err", err) // JetStream out of reach: the lease ages
			}
		}
		held := lease != nil && c.now().Sub(renewed) < ttl
		if held {
			c.m.Leader.Set(1)
		} else {
			c.m.Leader.Set(0)
		}
		switch {
		case term.finished():
			if err := term.stop(); err != nil {
				c.log.Warn("a term of leadership ended", "err", err)
			}
			term = nil // begun again after the next renewal
		case held && term == nil:
			if err := standby.stop(); err != nil {
				c.log.Warn("following the farm's journal", "err", err)
			}
			standby = nil
			c.m.Terms.Inc()
			token := lease.Token
			term = start(ctx, func(ctx context.Context) error { return c.term(ctx, token, c.leaderLoops()) })
			if c.cfg.Faults.DeafLeaderFor > 0 && deafAt.IsZero() && !deafDone {
				deafAt = c.now().Add(c.cfg.Faults.DeafLeaderAfter)
			}
		case !held && term != nil:
			c.log.Warn("no longer leading the farm: its leadership lease is lost or not renewed within the TTL")
			c.journal.leading.Store(false) // no write from now on, while the leader's loops wind down
			_ = term.stop()
			term = nil
		}
		if term == nil && standby.finished() {
			if err := standby.stop(); err != nil {
				c.log.Warn("following the farm's journal", "err", err)
			}
			standby = nil
		}
		if term == nil && standby == nil {
			standby = start(ctx, func(ctx context.Context) error { return c.follow(ctx, false) })
		}
		if !deafDone && !deafAt.IsZero() && !c.now().Before(deafAt) {
			c.log.Warn("fault injection: the leadership loop goes deaf", "for", c.cfg.Faults.DeafLeaderFor)
			queue.Sleep(ctx, c.cfg.Faults.DeafLeaderFor)
			deafDone = true // once
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// running is a goroutine leadLoop started and stops: a term or the following of the journal.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func start(ctx context.Context, fn func(context.Context) error) *running {
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = fn(ctx)
	}()
	return r
}

// stop cancels r and waits for it; nil stops nothing.
func (r *running) stop() error {
	if r == nil {
		return nil
	}
	r.cancel()
	<-r.done
	return r.err
}

func (r *running) finished() bool {
	if r == nil {
		return false
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Leader reads who holds the farm's leadership lease: nil while nobody does.
func (c *Coordinator) Leader(ctx context.Context) (*api.Leader, error) {
	held, _, err := c.queue.Leases.Owner(ctx, leaderKey)
	if err != nil || held == "" {
		return nil, err
	}
	var claim leaderClaim
	if err := json.Unmarshal([]byte(held), &claim); err != nil {
		return nil, fmt.Errorf("reading the farm's leadership lease: %w", err)
	}
	return &api.Leader{Address: claim.Address, ID: claim.ID, This: claim.ID == c.leaderID}, nil
}
