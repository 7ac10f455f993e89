// Package faults makes real processes misbehave at the seams of the farm's flows, so fault
// tests exercise the very binaries that ship (docs/design.md, "Fault injection"). A Plan says
// what to break; both commands take it from the same hidden --fault-* flags (AddFlags); an
// Injector carries it out in one process, as wrappers around what a worker renders with, stores
// into and publishes to, and at the few seams a flow names itself (At). A nil Injector breaks
// nothing, so production code calls it unconditionally.
package faults

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/objstore"
	"github.com/tilefarm/tilefarm/render"
)

// The seams of the worker's Render and Finalize flows at which a worker can be killed, in the
// order a tile passes them.
const (
	BeforeLease     = "before-lease"     // the manifest checked, the lease not taken yet
	MidPass         = "mid-pass"         // half a pass rendered, once a checkpoint of the tile is in the store
	AfterCheckpoint = "after-checkpoint" // a remote checkpoint uploaded
	AfterUpload     = "after-upload"     // the tile's attempt objects uploaded and verified, its manifest not created
	AfterManifest   = "after-manifest"   // the manifest created, no event published
	AfterEvent      = "after-event"      // tile.completed published, the checkpoints not deleted, no ack
	BeforeAck       = "before-ack"       // everything done but the ack
)

// The seams of the coordinator's submission, outbox relay and notifier.
const (
	SubmitAfterCommit   = "submit-after-commit"   // a submission committed, not answered
	OutboxBeforePublish = "outbox-before-publish" // an outbox record read, nothing published
	OutboxMidPublish    = "outbox-mid-publish"    // half of a record's messages published and acknowledged
	OutboxAfterPublish  = "outbox-after-publish"  // the PubAcks in, the record not deleted
	NotifyBeforeDeliver = "notify-before-deliver" // a notification recorded, nothing of it delivered
)

// WorkerSeams and CoordinatorSeams list the seams of each process, for --fault-crash.
var (
	WorkerSeams      = []string{BeforeLease, MidPass, AfterCheckpoint, AfterUpload, AfterManifest, AfterEvent, BeforeAck}
	CoordinatorSeams = []string{SubmitAfterCommit, OutboxBeforePublish, OutboxMidPublish, OutboxAfterPublish, NotifyBeforeDeliver}
)

// TileAt names one tile: a frame and a pixel rectangle.
type TileAt struct {
	Frame int
	Rect  render.Rect
}

// Plan is what a process breaks. The zero Plan breaks nothing.
type Plan struct {
	// Crash names a seam at which the process is killed (Kill is called), the first time it
	// passes it.
	Crash string
	// Kill ends the process at the crash seam; the commands SIGKILL themselves, so a test sees
	// what a real crash there leaves behind.
	Kill func(seam string)
	// PassDelay sleeps after each pass of a tile, so a test can kill a worker mid-tile.
	PassDelay time.Duration
	// SampleDelay renders a tile's samples one at a time, each after the delay, the way a slow
	// real render gains them: a kill then loses the samples since the last checkpoint.
	SampleDelay time.Duration
	// PanicTile, if set, panics in every attempt at that tile.
	PanicTile *TileAt
	// SlowTile, if set, sleeps SlowTileDelay after each pass of that tile (on top of
	// PassDelay): one tile made slow on purpose, so a test can find it in the render times.
	SlowTile      *TileAt
	SlowTileDelay time.Duration
	// FailPublish fails the first FailPublishN publishes of events of this type as a NATS
	// timeout would.
	FailPublish  string
	FailPublishN int
	// DeafLeaderAfter and DeafLeaderFor make a coordinator's leadership loop stop renewing and
	// reading the farm's leadership lease DeafLeaderAfter after its first term began, for
	// DeafLeaderFor, while everything else goes on acting: a leader deposed that has not
	// noticed yet, as a long pause of that one goroutine would make it.
	DeafLeaderAfter, DeafLeaderFor time.Duration
	// BeforeLease runs right before a tile's lease is taken (for tests that run a worker in
	// process).
	BeforeLease func(job wire.TileJob)
}

// Injector carries out a Plan in one process (one worker, or one coordinator).
type Injector struct {
	plan Plan
	log  *slog.Logger

	mu        sync.Mutex
	crashed   bool
	published int                      // injected publish failures so far
	uploaded  map[string]chan struct{} // closed once a checkpoint of the tile key is in the store
}

// New makes the injector of plan, or nil when the plan breaks nothing. log says, before a
// crash, where it strikes.
func New(plan Plan, log *slog.Logger) *Injector {
	if plan.Crash == "" && plan.PassDelay <= 0 && plan.SampleDelay <= 0 && plan.PanicTile == nil &&
		plan.SlowTile == nil && plan.FailPublish == "" && plan.BeforeLease == nil {
		return nil
	}
	if log == nil {
		log = slog.Default()
	}
	return &Injector{plan: plan, log: log, uploaded: map[string]chan struct{}{}}
}

// Armed reports whether seam is the plan's crash seam.
func (i *Injector) Armed(seam string) bool {
	return i != nil && i.plan.Crash == seam && i.plan.Kill != nil
}

// At kills the process if seam is the plan's crash seam, the first time it is passed, saying
// first on log (the flow's, which names the work) where it strikes.
func (i *Injector) At(log *slog.Logger, seam string) {
	if !i.Armed(seam) {
		return
	}
	i.mu.Lock()
	first := !i.crashed
	i.crashed = true
	i.mu.Unlock()
	if first {
		log.Warn("fault injection: crashing at a seam", "seam", seam)
		i.plan.Kill(seam)
	}
}

// BeforeLease runs the plan's hook for a tile about to be leased.
func (i *Injector) BeforeLease(job wire.TileJob) {
	if i != nil && i.plan.BeforeLease != nil {
		i.plan.BeforeLease(job)
	}
}

// Publish is how a worker publishes an event: its subject and payload.
type Publish func(ctx context.Context, subject string, data []byte) error

// ErrInjectedTimeout is what an injected publish failure looks like: a NATS timeout, which the
// worker retries in place.
var ErrInjectedTimeout = fmt.Errorf("injected fault: %w", nats.ErrTimeout)

// Publisher wraps publish: the plan's publish failures, and the after-event seam once a
// tile.completed event is out.
func (i *Injector) Publisher(publish Publish) Publish {
	if i == nil {
		return publish
	}
	return func(ctx context.Context, subject string, data []byte) error {
		if i.failPublish(subject) {
			return fmt.Errorf("publishing %s: %w", subject, ErrInjectedTimeout)
		}
		return publish(ctx, subject, data)
	}
}

func (i *Injector) failPublish(subject string) bool {
	if i.plan.FailPublish == "" || subject != (wire.Event{Type: i.plan.FailPublish}).Subject() {
		return false
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.published >= i.plan.FailPublishN {
		return false
	}
	i.published++
	return true
}

// Store wraps a worker's object store: the after-upload, after-manifest and after-checkpoint
// seams strike around the tile's own writes, and the uploads of checkpoints are noted for the
// mid-pass seam.
func (i *Injector) Store(s objstore.Store) objstore.Store {
	if i == nil {
		return s
	}
	return &store{Store: s, i: i}
}

type store struct {
	objstore.Store
	i *Injector
}

func (s *store) Put(ctx context.Context, key string, data []byte) error {
	err := s.Store.Put(ctx, key, data)
	if tile, ok := layout.CheckpointTile(key); ok && err == nil {
		s.i.checkpointed(tile)
		s.i.At(s.i.log.With("tile_key", tile), AfterCheckpoint)
	}
	return err
}

func (s *store) PutIfAbsent(ctx context.Context, key string, data []byte) error {
	tile, ok := layout.TileManifestTile(key)
	if ok {
		s.i.At(s.i.log.With("tile_key", tile), AfterUpload)
	}
	err := s.Store.PutIfAbsent(ctx, key, data)
	if ok && err == nil {
		s.i.At(s.i.log.With("tile_key", tile), AfterManifest)
	}
	return err
}

// checkpointed notes that a checkpoint of tile is in the store.
func (i *Injector) checkpointed(tile string) {
	ch := i.uploadedCh(tile)
	i.mu.Lock()
	defer i.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (i *Injector) uploadedCh(tile string) chan struct{} {
	i.mu.Lock()
	defer i.mu.Unlock()
	ch, ok := i.uploaded[tile]
	if !ok {
		ch = make(chan struct{})
		i.uploaded[tile] = ch
	}
	return ch
}

// Tile wraps the tile of key (frame, rect) a worker renders, after the worker's own counting
// of samples, so samples rendered one at a time are counted as they land: the plan's panic,
// its delays, and the mid-pass seam. log is the tile run's.
func (i *Injector) Tile(t scene.Tile, key string, frame int, r render.Rect, st render.Settings, log *slog.Logger) scene.Tile {
	if i == nil {
		return t
	}
	at := TileAt{frame, r}
	slow := time.Duration(0)
	if i.plan.SlowTile != nil && *i.plan.SlowTile == at {
		slow = i.plan.SlowTileDelay
	}
	return &tile{Tile: t, i: i, key: key, panics: i.plan.PanicTile != nil && *i.plan.PanicTile == at,
		slow: slow, frame: frame, rect: r, split: st.Passes == 0, log: log}
}

type tile struct {
	scene.Tile
	i      *Injector
	key    string
	panics bool
	slow   time.Duration // slept after each pass, on top of the plan's PassDelay
	frame  int
	rect   render.Rect
	split  bool // the worker chooses the passes, so one can be rendered in two halves
	log    *slog.Logger
}

func (t *tile) Render(ctx context.Context, from, to int) error {
	if t.panics {
		panic(fmt.Sprintf("injected fault in frame %d tile %v", t.frame, t.rect))
	}
	// Half a pass rendered and not checkpointed is what a kill inside a pass leaves. The first
	// pass has no checkpoint to resume from, so the seam strikes in a later one, once a
	// checkpoint of the tile is in the store (waiting for the upload of the last).
	if t.i.Armed(MidPass) && from > 0 && to-from > 1 && t.split {
		select {
		case <-t.i.uploadedCh(t.key):
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := t.render(ctx, from, from+(to-from)/2); err != nil {
			return err
		}
		t.i.At(t.log, MidPass)
		from = t.Next()
	}
	if err := t.render(ctx, from, to); err != nil {
		return err
	}
	if d := t.i.plan.PassDelay + t.slow; d > 0 {
		queue.Sleep(ctx, d)
	}
	return nil
}

// render renders [from, to), one sample at a time after the plan's sample delay if it has one.
func (t *tile) render(ctx context.Context, from, to int) error {
	d := t.i.plan.SampleDelay
	if d <= 0 {
		return t.Tile.Render(ctx, from, to)
	}
	for s := from; s < to; s++ {
		if !queue.Sleep(ctx, d) {
			return ctx.Err()
		}
		if err := t.Tile.Render(ctx, s, s+1); err != nil {
			return err
		}
	}
	return nil
}
