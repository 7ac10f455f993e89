package queue

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/tilefarm/tilefarm/internal/api"
)

// Buckets through which the coordinator and the workers tell each other what is live.
const (
	// BucketDropped holds the frames no live job wants any more (their jobs were cancelled);
	// workers drop such a frame's tiles before leasing one and between passes. A mark lasts
	// EventsRetention, so the bucket stays bounded: a tile of a cancelled frame still queued
	// after that is rendered (wasted, never wrong).
	BucketDropped = "dropped"
	// BucketWorkers holds each live worker's heartbeat; an entry expires WorkerTTL after the
	// worker's last beat, so a killed worker leaves the list by itself.
	BucketWorkers = "workers"
	// WorkerTTL is how long a worker's heartbeat entry outlives its last beat.
	WorkerTTL = 15 * time.Second
	// WorkerBeat is how often a worker refreshes its entry: three beats per TTL, so one lost
	// beat does not drop a live worker.
	WorkerBeat = WorkerTTL / 3
)

// setupDirectory creates the two buckets; the coordinator calls it through Setup.
func setupDirectory(ctx context.Context, js jetstream.JetStream, cfg Config) (*Dropped, *Workers, error) {
	dkv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: BucketDropped, Description: "tilefarm frames whose jobs were all cancelled", History: 1,
		TTL: EventsRetention, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("setting up bucket %s: %w", BucketDropped, err)
	}
	wkv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: BucketWorkers, Description: "tilefarm worker heartbeats", History: 1, TTL: WorkerTTL,
		Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("setting up bucket %s: %w", BucketWorkers, err)
	}
	return &Dropped{kv: dkv}, &Workers{kv: wkv}, nil
}

// openDirectory binds to the two buckets; workers call it through Open.
func openDirectory(ctx context.Context, js jetstream.JetStream) (*Dropped, *Workers, error) {
	dkv, err := js.KeyValue(ctx, BucketDropped)
	if err != nil {
		return nil, nil, fmt.Errorf("binding to bucket %s: %w", BucketDropped, err)
	}
	wkv, err := js.KeyValue(ctx, BucketWorkers)
	if err != nil {
		return nil, nil, fmt.Errorf("binding to bucket %s: %w", BucketWorkers, err)
	}
	return &Dropped{kv: dkv}, &Workers{kv: wkv}, nil
}

// Dropped is the set of frames whose every job was cancelled, and of frames whose tiles have
// copies queued in another band (a reprioritized job's): each frame's mark (FrameMark).
type Dropped struct{ kv jetstream.KeyValue }

// Marks of a frame in the dropped bucket.
const (
	markDropped = "1"
	markCopies  = "copies"
)

// FrameMark is what the dropped bucket says of a frame.
type FrameMark struct {
	// Dropped: every job asking for the frame was cancelled; its tiles are not rendered.
	Dropped bool
	// Copies: the frame's tiles were dispatched again in another band while their first
	// copies stayed queued, so a tile message marked First (wire.TileJob) may be a stale copy
	// of a tile promoted since, and is checked as a redelivery is.
	Copies bool
}

// MarkCopies marks that frameKey's tiles have copies in another band. A dropped mark stays.
func (d *Dropped) MarkCopies(ctx context.Context, frameKey string) error {
	if _, err := d.kv.Create(ctx, frameKey, []byte(markCopies)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("marking frame %.12s copied: %w", frameKey, err)
	}
	return nil
}

// Add marks frameKey dropped.
func (d *Dropped) Add(ctx context.Context, frameKey string) error {
	if _, err := d.kv.Put(ctx, frameKey, []byte(markDropped)); err != nil {
		return fmt.Errorf("marking frame %.12s dropped: %w", frameKey, err)
	}
	return nil
}

// Revive makes the dropped frameKey wanted again, before its tiles are dispatched anew: its
// dropped copies may still queue, so it stays marked as having copies (FrameMark.Copies).
func (d *Dropped) Revive(ctx context.Context, frameKey string) error {
	if _, err := d.kv.Put(ctx, frameKey, []byte(markCopies)); err != nil {
		return fmt.Errorf("marking frame %.12s wanted: %w", frameKey, err)
	}
	return nil
}

// Remove makes frameKey wanted again, with no copies of its tiles queued (the stream lost
// them), before its tiles are dispatched anew.
func (d *Dropped) Remove(ctx context.Context, frameKey string) error {
	if err := d.kv.Purge(ctx, frameKey); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("marking frame %.12s wanted: %w", frameKey, err)
	}
	return nil
}

// Mark reads frameKey's mark: one read of the bucket.
func (d *Dropped) Mark(ctx context.Context, frameKey string) (FrameMark, error) {
	e, err := d.kv.Get(ctx, frameKey)
	switch {
	case err == nil:
		return FrameMark{Dropped: string(e.Value()) != markCopies, Copies: string(e.Value()) == markCopies}, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return FrameMark{}, nil
	}
	return FrameMark{}, fmt.Errorf("reading the mark of frame %.12s: %w", frameKey, err)
}

// Workers is the heartbeat directory. A process that lists it often runs Follow, which keeps
// a copy current from a watch of the bucket; List reads that copy while it is current.
type Workers struct {
	kv jetstream.KeyValue

	mu        sync.Mutex
	following bool                   // the copy is current: Follow has the bucket's values
	beats     map[string]workerEntry // by key
}

// workerEntry is a worker's last heartbeat and when it was written, which is when the bucket
// expires it (WorkerTTL later).
type workerEntry struct {
	info api.Worker
	at   time.Time
}

// workerKey is a key for any worker name: names may hold characters keys may not.
func workerKey(name string) string { return hex.EncodeToString([]byte(name)) }

// Beat records info as the worker's current heartbeat.
func (w *Workers) Beat(ctx context.Context, info api.Worker) error {
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	if _, err := w.kv.Put(ctx, workerKey(info.Name), data); err != nil {
		return fmt.Errorf("heartbeat of worker %s: %w", info.Name, err)
	}
	return nil
}

// Leave removes a worker that stops cleanly, at once rather than after its TTL.
func (w *Workers) Leave(ctx context.Context, name string) error {
	if err := w.kv.Purge(ctx, workerKey(name)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("removing worker %s: %w", name, err)
	}
	return nil
}

// List returns the live workers, by name: from the copy Follow keeps when it is current (no
// request at all), else read from the bucket, a key listing and a get per worker.
func (w *Workers) List(ctx context.Context) ([]api.Worker, error) {
	w.mu.Lock()
	if w.following {
		out := make([]api.Worker, 0, len(w.beats))
		for k, e := range w.beats {
			if time.Since(e.at) > WorkerTTL {
				delete(w.beats, k) // expired: the bucket removed it without a word
				continue
			}
			out = append(out, e.info)
		}
		w.mu.Unlock()
		sortWorkers(out)
		return out, nil
	}
	w.mu.Unlock()
	lister, err := w.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	var out []api.Worker
	for k := range lister.Keys() {
		e, err := w.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("reading worker %s: %w", k, err)
		}
		if info, ok := decodeWorker(e.Value()); ok {
			out = append(out, info)
		}
	}
	sortWorkers(out)
	return out, nil
}

// decodeWorker decodes a heartbeat. An entry that does not decode is skipped: it cannot be a
// worker of this farm's version.
func decodeWorker(data []byte) (api.Worker, bool) {
	var info api.Worker
	return info, json.Unmarshal(data, &info) == nil && info.Name != ""
}

func sortWorkers(ws []api.Worker) {
	slices.SortFunc(ws, func(a, b api.Worker) int { return strings.Compare(a.Name, b.Name) })
}

// Follow keeps List's copy of the directory current from a watch of the bucket until ctx is
// done or the watch fails (List then reads the bucket again). A heartbeat counts from when the
// watch delivered it (the bucket's own time for those it held when the watch began), so the
// copy expires a worker WorkerTTL after its last beat as the bucket does, whatever the
// server's clock says; a worker that leaves is removed at once. Listing the bucket instead
// costs a get per worker each time, a load that grows with the fleet (docs/benchmarks.md,
// "Fleet"). beat, if not nil, is called with every heartbeat the watch delivers and when it
// counts from, in the order they came (the coordinator's history of each worker's slots).
func (w *Workers) Follow(ctx context.Context, beat func(info api.Worker, at time.Time)) error {
	watch, err := w.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watching the worker directory: %w", err)
	}
	defer watch.Stop()
	defer func() {
		w.mu.Lock()
		w.following, w.beats = false, nil
		w.mu.Unlock()
	}()
	beats := map[string]workerEntry{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-watch.Updates():
			if !ok {
				return errors.New("watching the worker directory: the watch ended")
			}
			w.mu.Lock()
			switch {
			case e == nil: // every value the bucket held is in: the copy is current from now
				w.following, w.beats = true, beats
			case e.Operation() != jetstream.KeyValuePut:
				delete(beats, e.Key())
			default:
				at := time.Now()
				if !w.following && e.Created().Before(at) {
					at = e.Created()
				}
				if info, ok := decodeWorker(e.Value()); ok {
					beats[e.Key()] = workerEntry{info: info, at: at}
					if beat != nil {
						w.mu.Unlock()
						beat(info, at)
						continue
					}
				}
			}
			w.mu.Unlock()
		}
	}
}
