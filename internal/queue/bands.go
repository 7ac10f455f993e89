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
				msg, err := fetchNoWait(ctx, c)
				if msg != nil || err != nil {
					return msg, err
				}
			}
		}
		// Every band is empty: wait on the default pool's normal band, where most tiles are, a
		// little at a time, so a tile arriving in another band or pool is seen soon.
		left := time.Until(deadline)
		if left <= 0 {
			return nil, ctx.Err()
		}
		msg, err := s.q.fetchOne(ctx, s.q.Bands[BandNormal], min(left, bandIdle))
		if msg != nil || err != nil {
			return msg, err
		}
	}
}

// FetchAssembly pulls one frame assembly job of a pool the worker serves, waiting at most
// wait; (nil, nil) when none arrived.
func (s *Sources) FetchAssembly(ctx context.Context, wait time.Duration) (jetstream.Msg, error) {
	s.refresh(ctx)
	if _, asm := s.snapshot(); len(asm) > 1 {
		for _, c := range asm {
			msg, err := fetchNoWait(ctx, c)
			if msg != nil || err != nil {
				return msg, err
			}
		}
		wait = min(wait, bandIdle) // and look at the other pools again soon
	}
	return s.q.fetchOne(ctx, s.q.Assemblers, wait)
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
	// A pool at its slot limit (MaxAckPending) answers 409 "Exceeded MaxAckPending": nothing
	// for now, as if empty.
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) &&
		!strings.Contains(err.Error(), "MaxAckPending") {
		return nil, fmt.Errorf("fetching from %s/%s: %w", StreamTiles, cons.CachedInfo().Name, err)
	}
	return nil, nil
}
