package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Band is a dispatch priority band. A job's tiles go on its band's subject, each band has a
// consumer of its own, and workers take from the highest non-empty band first, so a job of
// higher priority submitted after a large one has its tiles rendered before the rest of the
// large one. Within a band, tiles are taken in the order they were queued.
type Band int

// The bands, lowest first. BandNormal keeps the subject and consumer of a farm without bands.
const (
	BandLow Band = iota
	BandNormal
	BandHigh
	NumBands
)

var bandNames = [NumBands]string{"low", "normal", "high"}

func (b Band) String() string {
	if b >= 0 && b < NumBands {
		return bandNames[b]
	}
	return fmt.Sprintf("band_%d", int(b))
}

// BandOf is the band of a job of the given priority.
func BandOf(priority int) Band {
	switch {
	case priority < 0:
		return BandLow
	case priority > 0:
		return BandHigh
	}
	return BandNormal
}

// Subject is where tile jobs of band b are published.
func (b Band) Subject() string {
	if b == BandNormal {
		return SubjectRender
	}
	return SubjectRender + "." + b.String()
}

// Consumer is the shared durable pull consumer of band b.
func (b Band) Consumer() string {
	if b == BandNormal {
		return ConsumerWorkers
	}
	return ConsumerWorkers + "-" + b.String()
}

// IsRenderSubject reports whether subject carries tile render jobs, of any band and pool.
func IsRenderSubject(subject string) bool {
	return subject == SubjectRender || strings.HasPrefix(subject, SubjectRender+".")
}

// bandIdle is how long a worker's pull waits when every band was empty: a tile queued in
// another band than the one waited on waits at most this long for a worker.
const bandIdle = 250 * time.Millisecond

// FetchTile pulls one tile render job from the highest band that has one, in any pool the
// worker serves, waiting at most wait; (nil, nil) when none arrived. One at a time, because a
// buffered message already burns its ack-wait.
func (s *Sources) FetchTile(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	if wait <= 0 {
		return nil, fmt.Errorf("fetching a tile: wait must be positive, got %v", wait)
	}
	deadline := time.Now().Add(wait)
	for {
		s.refresh(ctx)
		tiles, _ := s.snapshot()
		for b := NumBands - 1; b >= 0; b-- {
			for _, c := range tiles[b] {
				if msg, err := fetchNoWait(ctx, c); msg != nil || err != nil {
					return s.settle(msg, err, c, false)
				}
			}
		}
		// Every band is empty: wait where the last tile came from, a little at a time, so a
		// tile arriving in another band or pool is seen soon.
		left := time.Until(deadline)
		if left <= 0 {
			return nil, ctx.Err()
		}
		home, _ := s.homes()
		if home == nil { // avoided: nowhere to wait but here
			if !Sleep(ctx, min(left, bandIdle)) {
				return nil, ctx.Err()
			}
			continue
		}
		if msg, err := s.q.fetchOne(ctx, home, min(left, bandIdle)); msg != nil || err != nil {
			return s.settle(msg, err, home, false)
		}
	}
}

// FetchAssembly pulls one frame assembly job of a pool the worker serves, waiting at most
// wait; (nil, nil) when none arrived. A worker of several pools waits at most bandIdle where
// the last one came from, so the other pools are looked at again soon; a worker of one waits
// the whole wait there, since every worker keeps this pull waiting and a fleet's short ones
// would be a load that grows with its workers (docs/benchmarks.md, "Fleet").
func (s *Sources) FetchAssembly(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	s.refresh(ctx)
	idle := wait
	if _, asm := s.snapshot(); len(asm) > 1 {
		idle = min(wait, bandIdle)
		for _, c := range asm {
			if msg, err := fetchNoWait(ctx, c); msg != nil || err != nil {
				return s.settle(msg, err, c, true)
			}
		}
	}
	_, home := s.homes()
	msg, err := s.q.fetchOne(ctx, home, idle)
	return s.settle(msg, err, home, true)
}

// fetchNoWait takes one message from cons if it has one ready, without waiting.
func fetchNoWait(ctx context.Context, cons jetstream.Consumer) (jetstream.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		return nil, fmt.Errorf("fetching from %s/%s: %w", StreamTiles, cons.CachedInfo().Name, err)
	}
	for msg := range batch.Messages() {
		if msg != nil {
			return msg, nil
		}
	}
	if err := batch.Error(); err != nil && !nothingNow(err) {
		return nil, fmt.Errorf("fetching from %s/%s: %w", StreamTiles, cons.CachedInfo().Name, err)
	}
	return nil, nil
}

// nothingNow reports whether a pull's error only says that nothing is there for now: no
// message, the wait over, or a pool at its slot limit (MaxAckPending; the server answers 409
// "Exceeded MaxAckPending").
func nothingNow(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) || strings.Contains(err.Error(), "MaxAckPending")
}
