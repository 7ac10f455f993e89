package coordinator

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/notify"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// observe adds what lives outside the store to a status: its ETA and its blocklisting workers.
func (c *Coordinator) observe(st *api.Status) {
	c.eta.observe(c.now(), st)
	st.BlocklistedWorkers = c.directory.blocklisting(st.JobID)
	if st.State == api.JobQueued || st.State == api.JobRendering {
		if pool := (queue.Pool{Build: st.Build, Requires: st.Requires}); liveIn(pool, c.directory.list()) == 0 {
			st.WaitingFor = joinNonEmpty(", ", st.WaitingFor, "a live worker of the pool: "+pool.String())
		}
	}
}

// joinNonEmpty joins the parts that are not empty.
func joinNonEmpty(sep string, parts ...string) string {
	return strings.Join(slices.DeleteFunc(parts, func(s string) bool { return s == "" }), sep)
}

// Jobs lists the status of every job, oldest first, without their frames.
func (c *Coordinator) Jobs(ctx context.Context) ([]api.Status, error) {
	out, _, err := c.jobsWithFrames(ctx)
	for i := range out {
		out[i].Frames = nil
	}
	return out, err
}

// statusCache keeps each job's status as computed from the store, under the fingerprint of the
// records it came from (coorddb.Tx.Fingerprint), so a viewer asking again while nothing of the
// job changed costs hashing its stored records instead of decoding every frame: the event
// stream recomputes every job, finished ones included, twice a second while a farm renders.
// A status with failed frames also reads tile tables and failures, which the fingerprint does
// not cover, and is never cached.
type statusCache struct {
	mu   sync.Mutex
	jobs map[string]cachedStatus
	// keys are each job's frame keys, derived once: a job's frames never change.
	keys map[string][]string
	// index is, for the jobs of the last fingerprints, which of them has each frame.
	index frameIndex
}

// frameIndex says which of the jobs ids (by their position) has each frame.
type frameIndex struct {
	ids     []string
	byFrame map[string][]int
}

type cachedStatus struct {
	fingerprint uint64
	st          api.Status
}

// frameKeys returns j's frame keys, derived the first time.
func (sc *statusCache) frameKeys(j *coorddb.Job) []string {
	sc.mu.Lock()
	keys, ok := sc.keys[j.ID]
	sc.mu.Unlock()
	if ok {
		return keys
	}
	for n := range j.FrameNumbers() {
		keys = append(keys, j.FrameKey(n))
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.keys == nil {
		sc.keys = map[string][]string{}
	}
	sc.keys[j.ID] = keys
	return keys
}

// fingerprints returns the fingerprint of each of jobs' records (coorddb.Tx.FingerprintFrames)
// in one pass over the frames (coorddb.Tx.EachFrame), which costs a fraction of a lookup per
// frame: the event stream fingerprints every frame of every job twice a second.
func (sc *statusCache) fingerprints(tx *coorddb.Tx, jobs []*coorddb.Job) []uint64 {
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	sc.mu.Lock()
	index := sc.index
	sc.mu.Unlock()
	if !slices.Equal(index.ids, ids) {
		index = frameIndex{ids: ids, byFrame: map[string][]int{}}
		for i, j := range jobs {
			for _, k := range sc.frameKeys(j) {
				index.byFrame[k] = append(index.byFrame[k], i)
			}
		}
		sc.mu.Lock()
		sc.index = index
		sc.mu.Unlock()
	}
	fps := make([]uint64, len(jobs))
	seen := make([]int, len(jobs))
	for i, id := range ids {
		fps[i] = tx.JobFingerprint(id)
	}
	tx.EachFrame(func(key, raw []byte) {
		of := index.byFrame[string(key)]
		if len(of) == 0 {
			return
		}
		fp := coorddb.FrameFingerprint(key, raw)
		for _, i := range of {
			fps[i] += fp
			seen[i]++
		}
	})
	for i, j := range jobs {
		if keys := sc.frameKeys(j); seen[i] != len(keys) {
			fps[i] = tx.FingerprintFrames(j.ID, keys) // a frame not stored: hashed as absent
		}
	}
	own := slices.Clone(fps)
	at := make(map[string]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	for i, j := range jobs {
		fps[i] = withUpstream(tx, j, own[i], func(k *coorddb.Job) uint64 {
			if x, ok := at[k.ID]; ok {
				return own[x]
			}
			return tx.FingerprintFrames(k.ID, sc.frameKeys(k))
		})
	}
	return fps
}

// status is jobStatus(tx, j, tx.Frame), from the cache when j's records are as they were,
// and the fingerprint of those records (coorddb.Tx.FingerprintFrames). Callers get a copy of
// their own: addProgress changes its frames.
func (sc *statusCache) status(tx *coorddb.Tx, j *coorddb.Job) (api.Status, uint64, error) {
	of := func(k *coorddb.Job) uint64 { return tx.FingerprintFrames(k.ID, sc.frameKeys(k)) }
	return sc.statusAt(tx, j, withUpstream(tx, j, of(j), of))
}

// statusAt is status of j whose records' fingerprint is fp.
func (sc *statusCache) statusAt(tx *coorddb.Tx, j *coorddb.Job, fp uint64) (api.Status, uint64, error) {
	sc.mu.Lock()
	c, ok := sc.jobs[j.ID]
	sc.mu.Unlock()
	if ok && c.fingerprint == fp {
		return cloneStatus(c.st), fp, nil
	}
	st, err := jobStatus(tx, j, tx.Frame)
	if err != nil {
		return st, fp, err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if st.FramesFailed > 0 {
		delete(sc.jobs, j.ID)
		return st, fp, nil
	}
	if sc.jobs == nil {
		sc.jobs = map[string]cachedStatus{}
	}
	sc.jobs[j.ID] = cachedStatus{fingerprint: fp, st: cloneStatus(st)}
	return st, fp, nil
}

// fingerprintSeed seeds fingerprint's hash; a fingerprint is only compared within one process.
var fingerprintSeed = maphash.MakeSeed()

// withUpstream is the fingerprint own of job j's records and, for a job that waits for others,
// of every job it waits for, directly or through others (each fingerprinted by of): its status
// shows where they stand.
func withUpstream(tx *coorddb.Tx, j *coorddb.Job, own uint64, of func(*coorddb.Job) uint64) uint64 {
	fp := own
	up := j.Upstream()
	if len(up) == 0 {
		return fp
	}
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	write := func(v uint64) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	write(fp)
	seen := map[string]bool{j.ID: true}
	for len(up) > 0 {
		id := up[0]
		up = up[1:]
		if seen[id] {
			continue
		}
		seen[id] = true
		k, err := tx.Job(id)
		if err != nil {
			write(0)
			continue
		}
		write(of(k))
		up = append(up, k.Upstream()...)
	}
	return h.Sum64()
}

// keepOnly forgets the jobs not in ids (jobs the store no longer has).
func (sc *statusCache) keepOnly(ids map[string]bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for id := range sc.jobs {
		if !ids[id] {
			delete(sc.jobs, id)
		}
	}
	for id := range sc.keys {
		if !ids[id] {
			delete(sc.keys, id)
		}
	}
}

// cloneStatus copies st deeply enough that changing the copy's frames, or appending to its lists,
// leaves st as it was.
func cloneStatus(st api.Status) api.Status {
	st.Formats = slices.Clone(st.Formats)
	st.Frames = slices.Clone(st.Frames)
	st.Failures = slices.Clone(st.Failures)
	st.Outputs = slices.Clone(st.Outputs)
	st.BlocklistedWorkers = slices.Clone(st.BlocklistedWorkers)
	st.Notify = slices.Clone(st.Notify)
	st.After = slices.Clone(st.After)
	return st
}

// maxFailuresShown bounds the failure lines of one status.
const maxFailuresShown = 50

// jobStatus computes a job's status; frame looks its frames up (the transaction's, or a
// projection's that has them in memory already).
func jobStatus(tx *coorddb.Tx, j *coorddb.Job, frame func(fk string) (*coorddb.Frame, error)) (api.Status, error) {
	st := api.Status{JobID: j.ID, Scene: j.SceneName, SceneVersion: j.SceneVersion, Camera: j.Camera, Formats: j.Formats,
		FirstFrame: j.First, LastFrame: j.Last, FrameStep: j.Step, FramesTotal: j.Frames(), Priority: j.Priority, Created: j.Created, Outputs: []string{},
		Build: jobPool(j).Build, Requires: j.Requires, MaxSlots: j.MaxSlots, Pool: jobPool(j).String(), NotifyFrames: j.NotifyFrames,
		After: j.After, AfterFrames: j.AfterFrames}
	for _, u := range j.Notify {
		st.Notify = append(st.Notify, notify.Redact(u))
	}
	states := make([]coorddb.FrameState, 0, j.Frames())
	deps := newDepView(tx, frame)
	var waiting, blocked []int
	for n := range j.FrameNumbers() {
		f, err := frame(j.FrameKey(n))
		if err != nil {
			return st, fmt.Errorf("job %s frame %d: %w", j.ID, n, err)
		}
		s, err := deps.frameState(j, f)
		if err != nil {
			return st, err
		}
		states = append(states, s)
		waiting, blocked = sortFrame(waiting, blocked, n, s)
		spp := int64(f.Settings.SPP)
		fs := api.FrameStatus{Frame: f.Frame, FrameKey: f.Key, State: apiFrameState(s), TilesTotal: f.TilesTotal,
			TilesCompleted: f.TilesCompleted, TilesFailed: f.TilesFailed,
			SamplesTotal: int64(f.TilesTotal) * spp, SamplesDone: int64(f.TilesCompleted) * spp,
			RenderSeconds: float64(f.RenderMillis) / 1000}
		st.SamplesTotal += fs.SamplesTotal
		st.SamplesDone += fs.SamplesDone
		st.TilesTotal += f.TilesTotal
		st.TilesCompleted += f.TilesCompleted
		st.TilesFailed += f.TilesFailed
		st.TileAttempts += f.TileAttempts
		st.SamplesRecovered += f.SamplesRecovered
		switch s {
		case coorddb.FrameCompleted:
			st.FramesCompleted++
		case coorddb.FrameFailed:
			st.FramesFailed++
			fs.Error = frameError(tx, f)
			if len(st.Failures) < maxFailuresShown {
				st.Failures = append(st.Failures, fmt.Sprintf("frame %d: %s", f.Frame, fs.Error))
			}
		}
		st.Frames = append(st.Frames, fs)
	}
	st.State = apiJobState(j.State(states))
	if st.State != api.JobCancelled && st.State != api.JobFailed {
		var err error
		if st.WaitingFor, st.BlockedReason, err = deps.describe(j, waiting, blocked); err != nil {
			return st, err
		}
	}
	st.Movie = movieStatus(j, st.State)
	if st.PreviewFrames = j.PreviewFrames(); st.PreviewFrames != nil {
		st.PreviewDone = true
		for _, fs := range st.Frames {
			if slices.Contains(st.PreviewFrames, fs.Frame) && fs.State != api.FrameCompleted {
				st.PreviewDone = false
			}
		}
	}
	switch {
	case st.State == api.JobCancelled:
		st.Failures = append([]string{"cancelled at " + j.Cancelled.Format(time.RFC3339)}, st.Failures...)
	case j.Failed != "" && st.State == api.JobFailed:
		st.Failures = append([]string{j.Failed}, st.Failures...)
	}
	return st, nil
}

// addProgress adds the samples reported of tiles in progress (progressTracker.samples) to the
// frames that have any. A frame's samples never exceed what its tiles not completed yet can
// hold, so a report about a tile completed meanwhile, or a forged one, cannot count beyond it.
// Frames with nothing in progress cost a map lookup, none when nothing is in progress.
func addProgress(st *api.Status, inProgress map[string]int64) {
	if len(inProgress) == 0 {
		return
	}
	for i := range st.Frames {
		fs := &st.Frames[i]
		n, ok := inProgress[fs.FrameKey]
		if !ok {
			continue
		}
		n = min(n, fs.SamplesTotal-fs.SamplesDone)
		fs.SamplesDone += n
		st.SamplesDone += n
	}
}

// frameError says why a frame failed: its dead-lettered tiles with their last error, or its
// assembly's.
func frameError(tx *coorddb.Tx, f *coorddb.Frame) string {
	if f.AssemblyError != "" && f.TilesFailed == 0 {
		return "assembly: " + f.AssemblyError
	}
	table, err := tx.TileTable(f)
	if err != nil {
		return err.Error()
	}
	failures, err := tx.Failures(f.Key)
	if err != nil {
		return err.Error()
	}
	ft, err := f.Tiles()
	if err != nil {
		return err.Error()
	}
	var dead []int
	for i := range ft {
		if s, _ := table.Get(i); s == coorddb.TileDeadLettered {
			dead = append(dead, i)
		}
	}
	sort.Ints(dead)
	if len(dead) == 0 {
		return "failed"
	}
	i := dead[0]
	r := ft[i].Rect
	msg := fmt.Sprintf("tile %s (%d,%d)-(%d,%d) dead-lettered", ft[i].Key[:12], r.X0, r.Y0, r.X1, r.Y1)
	if l := failures[i]; len(l) > 0 {
		last := l[len(l)-1]
		msg += fmt.Sprintf(" [%s]: %s", last.Code, last.Error)
	}
	if len(dead) > 1 {
		msg += fmt.Sprintf(" (and %d more tiles)", len(dead)-1)
	}
	return msg
}

// Status computes a job's status from the projection: one frame record per frame, plus the
// failure details of failed frames and the samples of its tiles in progress.
func (c *Coordinator) Status(ctx context.Context, jobID string) (api.Status, error) {
	var st api.Status
	inProgress := c.progress.samples()
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		j, err := tx.Job(jobID)
		if err != nil {
			return err
		}
		if st, _, err = c.statuses.status(tx, j); err == nil {
			addProgress(&st, inProgress)
		}
		return err
	})
	if err == nil {
		c.observe(&st)
	}
	return st, err
}
