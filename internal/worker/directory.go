package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
)

// What a worker tells the farm about itself and decides for itself (docs/design.md, "Flows":
// Workers, Blocklist and Cancel): its heartbeat in the worker directory, the jobs it
// blocklisted, and the tiles of cancelled jobs it drops.

// DefaultBlocklistAfter is how many failed tiles of one job make a worker stop taking that
// job's tiles.
const DefaultBlocklistAfter = 3

// blocklistNakDelay is how long a tile of a blocklisted job is handed back for. A hand-back is
// free (queue.Queue.HandBack); the worker that handed it back then stays off the consumer it
// came from until the tile has been delivered again and a while after (avoidAfterHandBack), so
// the tile reaches another worker's pull whichever JetStream serves first, and an idle worker
// that blocklisted a job never spins on its tiles.
const blocklistNakDelay = time.Second

// blocklistGrace is how long past the tile's return a worker avoids the consumer after its
// n-th hand-back in a row of a blocklisted job's tile there: 500 ms, doubling to 8 s. An idle
// worker's pulls never leave a consumer unwatched that long (bandIdle), and a tile that came
// back anyway (no other worker was idle) is handed back again with a longer grace.
func blocklistGrace(n int) time.Duration {
	return min(500*time.Millisecond<<min(max(n, 1)-1, 4), 8*time.Second)
}

// avoidAfterHandBack keeps the worker's pulls off consumer (queue.Sources.Avoid) after it
// handed back a blocklisted job's tile from there: a worker that blocklisted a job stops being
// a candidate for its tiles. Tiles of other jobs queued there wait meanwhile, or go to the
// other workers; the next tile the worker takes from the consumer ends the streak (tookFrom).
func (w *Worker) avoidAfterHandBack(consumer string) {
	n := w.act.handedBackFrom(consumer)
	w.sources.Avoid(consumer, time.Now().Add(blocklistNakDelay+blocklistGrace(n)))
}

// handBackPause is how long a slot waits before its next fetch after n hand-backs in a row:
// 250 ms doubling to 1 s.
func handBackPause(n int) time.Duration {
	return min(250*time.Millisecond<<min(n-1, 2), time.Second)
}

// errDropped means the tile's frame was dropped while it rendered: its every job was cancelled.
var errDropped = errors.New("frame dropped: every job asking for it was cancelled")

// activity is what a worker is doing, for its heartbeat, and the jobs it blocklisted.
type activity struct {
	mu       sync.Mutex
	tiles    map[string]api.WorkerTile // by attempt id
	failures map[string]int            // failed tiles by job id
	blocked  []string                  // jobs whose tiles this worker no longer takes
	samples  int64                     // samples rendered, ever
	// streaks are the hand-backs in a row of blocklisted jobs' tiles, by the consumer they
	// came from (avoidAfterHandBack).
	streaks map[string]int
	// slots is the worker's tile slots; busy the slot-seconds its tiles held them, ever (a
	// tile finalizing behind the one rendering holds no slot of its own), counted up to
	// since.
	slots int
	busy  float64
	since time.Time
}

func newActivity(slots int) *activity {
	return &activity{tiles: map[string]api.WorkerTile{}, failures: map[string]int{}, streaks: map[string]int{}, slots: slots, since: time.Now()}
}

// handedBackFrom counts a blocklisted job's tile handed back to consumer and returns the
// hand-backs in a row there.
func (a *activity) handedBackFrom(consumer string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.streaks[consumer]++
	return a.streaks[consumer]
}

// tookFrom ends the streak of hand-backs to consumer: the worker took a tile of it to render.
func (a *activity) tookFrom(consumer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.streaks, consumer)
}

// account adds the slot-seconds since the last change; a.mu is held.
func (a *activity) account(now time.Time) {
	a.busy += float64(min(len(a.tiles), a.slots)) * now.Sub(a.since).Seconds()
	a.since = now
}

// start records a tile the worker renders.
func (a *activity) start(attempt string, t api.WorkerTile) {
	a.mu.Lock()
	a.account(time.Now())
	a.tiles[attempt] = t
	a.mu.Unlock()
}

// pass records a pass of the tile of attempt, which now has done samples, n of them just
// rendered.
func (a *activity) pass(attempt string, done, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.samples += int64(n)
	if t, ok := a.tiles[attempt]; ok {
		t.SamplesDone = done
		a.tiles[attempt] = t
	}
}

func (a *activity) end(attempt string) {
	a.mu.Lock()
	a.account(time.Now())
	delete(a.tiles, attempt)
	a.mu.Unlock()
}

// failed counts a failed tile of job and reports whether that blocklists the job now.
func (a *activity) failed(job string, after int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failures[job]++
	if a.failures[job] < after || slices.Contains(a.blocked, job) {
		return false
	}
	a.blocked = append(a.blocked, job)
	return true
}

func (a *activity) isBlocked(job string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Contains(a.blocked, job)
}

// snapshot is the heartbeat's view: the tiles rendering, the blocklist, the samples so far,
// the slot-seconds busy so far, and when (read under the lock, so no change is counted twice).
func (a *activity) snapshot() ([]api.WorkerTile, []string, int64, float64, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.account(now)
	tiles := make([]api.WorkerTile, 0, len(a.tiles))
	for _, t := range a.tiles {
		tiles = append(tiles, t)
	}
	slices.SortFunc(tiles, func(x, y api.WorkerTile) int {
		if x.TileKey < y.TileKey {
			return -1
		}
		if x.TileKey > y.TileKey {
			return 1
		}
		return 0
	})
	return tiles, slices.Clone(a.blocked), a.samples, a.busy, now
}

// beat keeps the worker's entry in the directory until ctx ends, then removes it: every
// queue.WorkerBeat it writes what the worker renders, how fast and what it blocklisted, from
// its start on, and again at once each time a renderer reports its build (capabilities), so a
// worker rendering is listed even while a slow renderer starts; until every renderer answered
// its entry says it is Starting, so no job is refused for a build it is about to report. A
// beat that fails is logged and tried again at the next; the entry outlives a few lost beats.
func (w *Worker) beat(ctx context.Context) {
	caps := w.cfg.Capabilities
	learned := make(chan queue.Capabilities, len(w.scenes.kinds))
	go w.capabilities(ctx, learned)
	host, _ := os.Hostname()
	t := time.NewTicker(queue.WorkerBeat)
	defer t.Stop()
	_, _, lastSamples, lastBusy, lastTime := w.act.snapshot()
	rate, busySlots := 0.0, 0.0
	for {
		tiles, blocked, samples, busy, now := w.act.snapshot()
		if dt := now.Sub(lastTime).Seconds(); dt > 0.5 {
			rate = float64(samples-lastSamples) / dt
			busySlots = (busy - lastBusy) / dt
			lastTime, lastSamples, lastBusy = now, samples, busy
		}
		info := api.Worker{Name: w.cfg.Name, Host: host, Slots: w.cfg.Concurrency, Tiles: tiles,
			SamplesPerSecond: rate, BusySlots: busySlots, LastSeen: now.UTC(), Blocklisted: blocked,
			Tags: caps.Tags, Builds: caps.Builds, Pools: w.sources.Pools(), Starting: learned != nil}
		if len(info.Pools) > api.MaxWorkerPools {
			info.Pools = info.Pools[:api.MaxWorkerPools]
		}
		if err := w.queue.Workers.Beat(ctx, info); err != nil && ctx.Err() == nil {
			w.log.Warn("worker heartbeat", "err", err)
		}
		select {
		case c, ok := <-learned:
			if !ok {
				learned = nil // every renderer answered
				continue
			}
			caps = c
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if err := w.queue.Workers.Leave(lctx, w.cfg.Name); err != nil {
				w.log.Warn("leaving the worker directory", "err", err)
			}
			cancel()
			return
		case <-t.C:
		}
	}
}

// capabilities completes the worker's with the builds of this machine's renderers (asked of
// each kind that has one, scene.Builder, at once: the built-in renderer answers at once,
// Blender once a process of it started, a second or two, or at once from its build cache) and
// has the worker pull from the pools each serves as soon as it is known. It sends out the
// capabilities after each answer, for the next beat, and closes out when every kind answered.
func (w *Worker) capabilities(ctx context.Context, out chan<- queue.Capabilities) {
	defer close(out)
	caps := w.cfg.Capabilities
	caps.Builds = slices.Clone(caps.Builds)
	type answer struct {
		builds []string
		err    error
	}
	answers := make(chan answer)
	asked := 0
	for _, k := range w.scenes.kinds {
		if b, ok := k.(scene.Builder); ok {
			asked++
			go func() {
				builds, err := b.Builds(ctx)
				if err != nil {
					err = fmt.Errorf("%s: %w", k.Name(), err)
				}
				answers <- answer{builds, err}
			}()
		}
	}
	for range asked {
		a := <-answers
		if a.err != nil && ctx.Err() == nil {
			w.log.Warn("renderer unavailable: this worker renders none of its scenes of that build", "err", a.err)
		}
		if len(a.builds) == 0 {
			continue
		}
		for _, b := range a.builds {
			w.log.Info("renderer available", "build", b)
		}
		caps.Builds = append(caps.Builds, a.builds...)
		slices.Sort(caps.Builds)
		w.sources.SetCapabilities(caps)
		out <- caps
	}
}

// frameDropped reports whether the tile's frame was dropped. A directory that cannot be read
// counts as not dropped: rendering a tile nobody wants wastes time, dropping one somebody
// wants would strand its job.
func (r *tileRun) frameDropped(ctx context.Context) bool {
	mark, err := r.w.queue.Dropped.Mark(ctx, r.job.FrameKey)
	if err != nil {
		r.log.Debug("reading dropped frames", "err", err)
		r.copies = true // not known: no store read is skipped
		return false
	}
	r.copies = mark.Copies
	return mark.Dropped
}

// drop settles the delivery of a tile of a dropped frame: acked, so it leaves the queue. Its
// checkpoints stay, so a job asking for the frame again resumes it.
func (r *tileRun) drop(ctx context.Context) error {
	r.log.Info("dropping tile: every job asking for its frame was cancelled")
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.msg.DoubleAck(actx); err != nil {
		r.log.Warn("acking a dropped tile", "err", err)
	}
	return errSettled
}
