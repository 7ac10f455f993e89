package coordinator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/faults"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// Relay batching: records read per round, and PubAcks awaited at most at once.
const (
	relayRecords = 64
	relayWindow  = 4096
)

// relay publishes the outbox. Each record names a frame; the relay derives its messages (one
// per tile, or one assembly), publishes them asynchronously, and deletes the record only once
// every PubAck of it is in. A crash anywhere republishes the record: an assembly's repeat is
// absorbed by JetStream's dedup window, and a tile's, which carries no dedup id, by the
// worker's manifest check, since a record published again marks its frame as having copies
// (beginPublishing).
func (c *Coordinator) relay(ctx context.Context) error {
	js, err := jetstream.New(c.nc, jetstream.WithPublishAsyncMaxPending(2*relayWindow))
	if err != nil {
		return fmt.Errorf("opening JetStream for the relay: %w", err)
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		recs, err := c.db.PendingOutbox(ctx, relayRecords)
		if err != nil {
			return fmt.Errorf("reading outbox: %w", err)
		}
		if len(recs) > 0 {
			if err := c.publishRecords(ctx, js, recs); err != nil {
				return err
			}
			if len(recs) == relayRecords {
				continue
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.relayKick:
		case <-t.C:
		}
	}
}

// outboxActions are what the relay does for a record that publishes nothing itself: a move of
// a frame's tiles (move) and the retirement of pools (retire), effects of a transaction made
// after it committed.
var outboxActions = map[coorddb.OutboxKind]func(c *Coordinator, ctx context.Context, r coorddb.OutboxRecord) error{
	coorddb.OutboxMove:   (*Coordinator).move,
	coorddb.OutboxRetire: (*Coordinator).retire,
}

// pendingAck is one published message awaiting its PubAck.
type pendingAck struct {
	fut jetstream.PubAckFuture
	id  string
}

// publishRecords publishes every message of recs, waits for their PubAcks and deletes recs.
func (c *Coordinator) publishRecords(ctx context.Context, js jetstream.JetStream, recs []coorddb.OutboxRecord) error {
	var window []pendingAck
	settle := func(n int) error {
		for _, p := range window[:n] {
			select {
			case ack := <-p.fut.Ok():
				if ack.Duplicate {
					c.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerPublishDedup).Inc()
				}
			case err := <-p.fut.Err():
				return fmt.Errorf("publishing %s: %w", p.id, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		window = window[n:]
		return nil
	}
	if err := c.beginPublishing(ctx, recs); err != nil {
		return err
	}
	seqs := make([]uint64, 0, len(recs))
	for _, r := range recs {
		if act := outboxActions[r.Kind]; act != nil {
			// What it does comes after every copy dispatched before it.
			if err := settle(len(window)); err != nil {
				return err
			}
			if err := act(c, ctx, r); err != nil {
				return fmt.Errorf("outbox record %d (%s of frame %s): %w", r.Seq, r.Kind, r.FrameKey, err)
			}
			seqs = append(seqs, r.Seq)
			continue
		}
		msgs, err := c.outboxMessages(ctx, r)
		if err != nil {
			return fmt.Errorf("outbox record %d (%s of frame %s): %w", r.Seq, r.Kind, r.FrameKey, err)
		}
		c.faults.At(c.log, faults.OutboxBeforePublish)
		for i, m := range msgs {
			if c.faults.Armed(faults.OutboxMidPublish) && i == len(msgs)/2 && i > 0 {
				if err := settle(len(window)); err != nil {
					return err
				}
				c.faults.At(c.log, faults.OutboxMidPublish)
			}
			id := queue.MsgID(m.Header)
			fut, err := js.PublishMsgAsync(m)
			if err != nil {
				return fmt.Errorf("publishing %s: %w", id, err)
			}
			window = append(window, pendingAck{fut: fut, id: id})
			if len(window) >= relayWindow {
				if err := settle(len(window) / 2); err != nil {
					return err
				}
			}
		}
		seqs = append(seqs, r.Seq)
	}
	if err := settle(len(window)); err != nil {
		return err
	}
	c.faults.At(c.log, faults.OutboxAfterPublish)
	if err := c.db.DeleteOutbox(ctx, seqs...); err != nil {
		return fmt.Errorf("deleting %d outbox records: %w", len(seqs), err)
	}
	return nil
}

// beginPublishing prepares recs for publishing. A record tried before may have put some or all
// of its messages in the stream already; its tiles carry no dedup id, so they may queue twice,
// and its frame is marked as having copies (queue.Dropped.MarkCopies) before it is published
// again: a worker then checks a copy marked First as it checks a redelivery, and the copy that
// comes second finds the tile promoted instead of rendering it again. The others are marked
// tried, durably, before any of their messages is published.
func (c *Coordinator) beginPublishing(ctx context.Context, recs []coorddb.OutboxRecord) error {
	var fresh []uint64
	for _, r := range recs {
		switch {
		case !r.Tried:
			fresh = append(fresh, r.Seq)
		case r.Kind == coorddb.OutboxTiles:
			if err := c.queue.Dropped.MarkCopies(ctx, r.FrameKey); err != nil {
				return fmt.Errorf("outbox record %d tried before: %w", r.Seq, err)
			}
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	if err := c.db.MarkOutboxTried(ctx, fresh...); err != nil {
		return fmt.Errorf("marking %d outbox records tried: %w", len(fresh), err)
	}
	return nil
}

// outboxMessages derives the messages of an outbox record from its frame. A record whose frame
// is gone has none.
func (c *Coordinator) outboxMessages(ctx context.Context, r coorddb.OutboxRecord) ([]*nats.Msg, error) {
	if r.Kind == coorddb.OutboxMovie {
		return c.movieMessages(ctx, r) // a job's, not a frame's
	}
	var f *coorddb.Frame
	var j *coorddb.Job
	var to target
	var objects coorddb.TileObjects
	err := c.db.View(ctx, func(tx *coorddb.Tx) (err error) {
		if f, err = tx.Frame(r.FrameKey); err != nil {
			return err
		}
		if r.Kind == coorddb.OutboxAssemble {
			if objects, err = tx.TileObjects(f); err != nil {
				return err
			}
		}
		if j, err = tx.Job(r.JobID); errors.Is(err, coorddb.ErrNotFound) {
			err = nil // a record of an older farm, or of a job since forgotten: the frame's build alone
		}
		if err != nil {
			return err
		}
		jobs, err := frameJobs(f, tx.Job)
		to = frameTarget(f, jobs, j, r.Priority)
		return err
	})
	if errors.Is(err, coorddb.ErrNotFound) {
		c.log.Warn("outbox record for an unknown frame; dropping it", "frame_key", r.FrameKey)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	pool := to.pool
	if err := c.queue.EnsurePool(ctx, pool); err != nil {
		return nil, err
	}
	switch r.Kind {
	case coorddb.OutboxTiles:
		return tileMessages(f, r, to)
	case coorddb.OutboxAssemble:
		if proven, err := c.proveTiles(ctx, f, j); err != nil || !proven {
			return nil, err
		}
		job := wire.AssembleJob{JobID: r.JobID, FrameKey: f.Key, SceneVersion: f.SceneVersion,
			Settings: f.Settings, Frame: f.Frame, TileSize: f.TileSize, Formats: f.Formats}
		withTileObjects(&job, objects)
		data, err := json.Marshal(job)
		if err != nil {
			return nil, err
		}
		return []*nats.Msg{newMsg(pool.AssembleSubject(), AssembleMsgID(f.Key, r.Assembly), data)}, nil
	}
	return nil, fmt.Errorf("unknown outbox record kind %q", r.Kind)
}

// maxTileObjects bounds the tiles whose objects an assembly job names (about 84 bytes each):
// a frame of more is assembled through its manifests, so the message stays far below
// JetStream's 1 MiB.
const maxTileObjects = 4096

// withTileObjects names in job the tiles' promoted objects the frame's workers reported, so
// the assembler reads each tile once; a frame with none known, or too many tiles, names none.
func withTileObjects(job *wire.AssembleJob, objects coorddb.TileObjects) {
	if objects.Build() == "" || objects.Len() > maxTileObjects {
		return
	}
	job.TileBuild = objects.Build()
	job.TileObjects = make([]string, objects.Len())
	for i := range job.TileObjects {
		job.TileObjects[i] = objects.Get(i)
	}
}

// proveTiles checks, before frame f is assembled, that every tile recorded completed has its
// manifest in the store (one listing): a completion is believed only with its proof, so a
// forged or mistaken tile.completed cannot skip work. Tiles without one go back to queued
// (coorddb.TileUnproven) and are dispatched again, the frame's assembly request is forgotten
// (flush asks again once they complete), and proven is false: nothing to publish. j is the
// record's job, nil when it is not known: then the tiles are trusted as before.
func (c *Coordinator) proveTiles(ctx context.Context, f *coorddb.Frame, j *coorddb.Job) (proven bool, err error) {
	if j == nil {
		return true, nil
	}
	promoted, err := c.listed(ctx, layout.TileManifestPrefix(f.Key))
	if err != nil {
		return false, err
	}
	ft, err := f.Tiles()
	if err != nil {
		return false, err
	}
	unproven := map[int]bool{}
	for i, t := range ft {
		if !promoted[t.Key] {
			unproven[i] = true
		}
	}
	if len(unproven) == 0 {
		return true, nil
	}
	n := 0
	err = c.update(ctx, func(p *projection) error {
		var err error
		if n, err = p.redispatch(f.Key, j, func(i int, s coorddb.TileState) bool {
			return unproven[i] && s == coorddb.TileCompleted
		}, coorddb.TileUnproven, coorddb.Order{}); err != nil || n == 0 {
			return err
		}
		return p.staleAssembly(f.Key)
	})
	if err != nil {
		return false, err
	}
	if n > 0 {
		c.log.Warn("tiles recorded completed have no manifest: dispatching them again", "frame_key", f.Key, "tiles", n)
		return false, nil
	}
	return true, nil // not recorded completed (yet): the assembly finds out
}

// poolOf is the pool that renders frame f for job j (nil: a job not known): the workers of the
// frame's renderer build with the job's tags, and the job's own pool when it limits its slots
// (docs/design.md, "Dispatch").
func poolOf(j *coorddb.Job, f *coorddb.Frame) queue.Pool {
	p := queue.Pool{Build: f.Settings.Build}
	if j != nil {
		p.Build = cmp.Or(j.Build, p.Build)
		p.Requires = j.Requires
		if j.MaxSlots > 0 {
			p.Job, p.Slots = j.ID, j.MaxSlots
		}
	}
	return p
}

// tileMessages derives the tile render jobs of a record for target to: every tile of its
// frame, or the ones it lists.
func tileMessages(f *coorddb.Frame, r coorddb.OutboxRecord, to target) ([]*nats.Msg, error) {
	ft, err := f.Tiles()
	if err != nil {
		return nil, err
	}
	idx := r.Tiles
	if idx == nil {
		idx = make([]int, len(ft))
		for i := range idx {
			idx[i] = i
		}
	}
	sh := identity.SettingsHash(f.Settings)
	msgs := make([]*nats.Msg, 0, len(idx))
	for _, i := range idx {
		if i < 0 || i >= len(ft) {
			return nil, fmt.Errorf("tile %d of a frame of %d tiles", i, len(ft))
		}
		t := ft[i]
		data, err := json.Marshal(wire.TileJob{JobID: r.JobID, TileKey: t.Key, FrameKey: f.Key, Index: i,
			SceneVersion: f.SceneVersion, Settings: f.Settings, Frame: f.Frame, Rect: t.Rect,
			InputHash: identity.InputHashFor(f.SceneVersion, sh, f.Frame, t.Rect), First: r.First && r.Tiles == nil && r.Retry == 0})
		if err != nil {
			return nil, err
		}
		m := nats.NewMsg(to.subject())
		m.Data = data
		m.Header.Set(queue.HeaderMsgID, TileMsgID(t.Key, r.Retry))
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// newMsg is a message JetStream deduplicates by id within the stream's dedup window.
func newMsg(subject, id string, data []byte) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, id)
	return m
}

// TileMsgID is the id of a tile's dispatch (queue.HeaderMsgID): its tile key the first time,
// and a suffix naming the frame's retry after, so a retry's failures count afresh.
func TileMsgID(tileKey string, retry int) string {
	if retry == 0 {
		return tileKey
	}
	return tileKey + ":retry:" + strconv.Itoa(retry)
}

// AssembleMsgID is the dedup id of the n-th assembly request of a frame: unique per request,
// so a second request (another format, a retry) is never swallowed by the dedup window.
func AssembleMsgID(frameKey string, n int) string {
	return "assemble:" + frameKey + ":" + strconv.Itoa(n)
}
