package fleet

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/queue"
)

// How dispatch latency is measured without a line of the worker changed. A worker's tile
// messages come through its jetstream.JetStream, which the host wraps (tapJS): each tile
// message a pull returns is noted with its publication time, the JetStream metadata timestamp
// the server gave it when it stored it. The fleet's renderer is told, in NewTile, that the tile
// was leased (the Render flow makes the tile right after the lease), and when the tile stops
// rendering (its last pass done, or cancelled), which is when the worker's slot is free to
// fetch its next tile: a rendered tile finalizes beside the next one's render. A tile's dispatch
// latency is then the time from when both it and a slot were ready to its lease:
// lease - max(publication, slot free). With idle workers that is publication to lease; under a
// backlog, where every tile waits for a slot by design, it is the slot's wait for its next
// tile (pull, dropped-frame check, lease). Both clocks are this machine's.

// Observer learns what the fleet's renderer sees of a worker's tiles.
type Observer interface {
	// Leased is told when a tile was leased, by its tile key.
	Leased(tileKey string, at time.Time)
	// Rendered is told when a tile stopped rendering, its last pass done or cancelled: the
	// worker's slot is free again.
	Rendered(at time.Time)
}

type observerKey struct{}

// WithObserver returns ctx carrying o: the fleet's tiles made under it report to o. A worker
// run with it (worker.Worker.Run) hands it down to its tiles.
func WithObserver(ctx context.Context, o Observer) context.Context {
	return context.WithValue(ctx, observerKey{}, o)
}

func observerFrom(ctx context.Context) Observer {
	o, _ := ctx.Value(observerKey{}).(Observer)
	return o
}

// Sample is one tile's dispatch as a worker saw it.
type Sample struct {
	Leased   time.Time     `json:"leased"`
	Dispatch time.Duration `json:"dispatch_ns"` // lease - max(publication, slot free)
	Waited   time.Duration `json:"waited_ns"`   // lease - publication: the tile's whole time in the queue
}

// Recorder keeps the samples of every worker of a process.
type Recorder struct {
	mu      sync.Mutex
	samples []Sample
}

func (r *Recorder) add(s Sample) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

// Samples returns a copy of the samples so far.
func (r *Recorder) Samples() []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.samples)
}

// probe is one worker's Observer. It runs one tile slot, so "the slot is free" is one time.
type probe struct {
	rec *Recorder

	mu        sync.Mutex
	published map[string]time.Time // by tile key, from fetch to lease
	free      time.Time            // when the slot last became free
}

func newProbe(rec *Recorder, start time.Time) *probe {
	return &probe{rec: rec, published: map[string]time.Time{}, free: start}
}

// fetched notes a tile message the worker pulled.
func (p *probe) fetched(tileKey string, published time.Time) {
	p.mu.Lock()
	p.published[tileKey] = published
	p.mu.Unlock()
}

func (p *probe) Leased(tileKey string, at time.Time) {
	p.mu.Lock()
	pub, ok := p.published[tileKey]
	delete(p.published, tileKey)
	free := p.free
	p.mu.Unlock()
	if !ok {
		return // not pulled through the tap: nothing to measure it from
	}
	p.rec.add(Sample{Leased: at, Dispatch: at.Sub(later(pub, free)), Waited: at.Sub(pub)})
}

func (p *probe) Rendered(at time.Time) {
	p.mu.Lock()
	p.free = at
	p.mu.Unlock()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// tapJS is a worker's JetStream, noting the tile messages its pulls return with their
// publication times (probe.fetched). Everything else passes through: the worker's queue is
// queue.Open of it.
type tapJS struct {
	jetstream.JetStream
	p *probe
}

func (j tapJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := j.JetStream.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return tapStream{Stream: s, p: j.p}, nil
}

type tapStream struct {
	jetstream.Stream
	p *probe
}

func (s tapStream) Consumer(ctx context.Context, name string) (jetstream.Consumer, error) {
	c, err := s.Stream.Consumer(ctx, name)
	if err != nil {
		return nil, err
	}
	return tapConsumer{Consumer: c, p: s.p}, nil
}

type tapConsumer struct {
	jetstream.Consumer
	p *probe
}

func (c tapConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return nil, err
	}
	return &tapBatch{MessageBatch: b, p: c.p}, nil
}

func (c tapConsumer) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.FetchNoWait(n)
	if err != nil {
		return nil, err
	}
	return &tapBatch{MessageBatch: b, p: c.p}, nil
}

// tapBatch forwards a pull's messages, noting each tile message on the way.
type tapBatch struct {
	jetstream.MessageBatch
	p    *probe
	once sync.Once
	out  chan jetstream.Msg
}

func (b *tapBatch) Messages() <-chan jetstream.Msg {
	b.once.Do(func() {
		in := b.MessageBatch.Messages()
		b.out = make(chan jetstream.Msg, cap(in))
		go func() {
			defer close(b.out)
			for msg := range in {
				b.note(msg)
				b.out <- msg
			}
		}()
	})
	return b.out
}

func (b *tapBatch) note(msg jetstream.Msg) {
	if msg == nil || !queue.IsRenderSubject(msg.Subject()) {
		return
	}
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	// A tile's message id is its tile key, with ":retry:N" or ":requeue:N" after a retry.
	key, _, _ := strings.Cut(queue.MsgID(msg.Headers()), ":")
	if key != "" {
		b.p.fetched(key, md.Timestamp)
	}
}
