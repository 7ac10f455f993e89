package coordinator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// projection applies changes to frames inside one store transaction. It is the one writer of
// frame and tile state: submit, the event consumer, the relay, the reconciler,
// retries and requeues all go through it, so every change passes the same state machine
// (coorddb.NextTileState) and the same frame settling (docs/design.md, "States").
type projection struct {
	ctx    context.Context
	c      *Coordinator
	tx     *coorddb.Tx
	now    time.Time
	frames map[string]*frameEdit
	order  []string // frames in the order they were first touched, for deterministic writes
	// jobs are the jobs read, once per projection (job), in jobOrder; flush writes those
	// changed (markJob). done caches which are completed (jobDone, deps.go).
	jobs     map[string]*jobEdit
	jobOrder []string
	done     map[string]bool
	// step is the flush step running (flushSteps), nil before flush: a step that only records
	// may no longer edit frames.
	step *flushStep

	// What the projection changed that the metrics count. Coordinator.counted adds them once
	// the transaction has committed, so a rolled-back or repeated transaction counts nothing.
	tileDeadLetters, assemblyDeadLetters, framesCompleted int
	// settled counts the frames whose state changed (writeFrames).
	settled int
	// stopped says a job was cancelled or given up (stopJob).
	stopped bool

	// touched are jobs whose announcement flush settles whatever their frames did, notices the
	// events it recorded (announce.go).
	touched []string
	notices int
	// failed are the tiles' failures recorded, for the workers page (fleet.go).
	failed []workerFailure
}

// frameEdit is one frame being changed in a projection.
type frameEdit struct {
	f        *coorddb.Frame
	before   *coorddb.Frame    // the frame as stored before this projection; nil for a new one
	table    coorddb.TileTable // loaded on first tile change
	rects    []render.Rect     // the frame's tiles, derived on first need
	reason   string            // why the frame fails, for its next transition
	tableMod bool
	dirty    bool // changed: flush writes it
	// objects are the tiles' promoted objects as reported (loaded on first need); objectsMod
	// says flush must write them.
	objects    coorddb.TileObjects
	objectsMod bool
	// times are the tiles' render times as reported (loaded on first need); timesMod says
	// flush must write them.
	times    coorddb.TileTimes
	timesMod bool
}

// doneBefore is the frame's Done before this projection: the formats promoted when it was
// loaded, none for a frame new in it. A frame whose Done grew past a job's formats completed
// for that job in this transaction (releaseWaiting, moviesDue).
func (e *frameEdit) doneBefore() []string {
	if e.before == nil {
		return nil
	}
	return e.before.Done
}

// completedFor reports whether the frame became completed in job j's formats in this
// projection.
func (e *frameEdit) completedFor(j *coorddb.Job) bool {
	return coorddb.HasAll(e.f.Done, j.Formats) && !coorddb.HasAll(e.doneBefore(), j.Formats)
}

// jobEdit is one job read in a projection: as stored before it (nil for the job a submission
// creates) and as it is now. Flush writes it if dirty (markJob).
type jobEdit struct {
	before *coorddb.Job
	j      *coorddb.Job
	dirty  bool
}

// newProjection starts a projection in tx, at the coordinator's now. Everything it does outside
// the database leaves through the outbox, after the commit.
func (c *Coordinator) newProjection(ctx context.Context, tx *coorddb.Tx) *projection {
	return &projection{ctx: ctx, c: c, tx: tx, now: c.now(), frames: map[string]*frameEdit{}}
}

// errEditAfterSettle is a flush step that only records changing what was already written.
var errEditAfterSettle = errors.New("changed after the flush wrote it")

// editable reports whether frames may still change: before flush, and in its steps that edit.
func (p *projection) editable() error {
	if p.step != nil && !p.step.edits {
		return fmt.Errorf("flush step %q: a frame %w", p.step.name, errEditAfterSettle)
	}
	return nil
}

// edit loads a frame to change it; flush writes it back.
func (p *projection) edit(fk string) (*frameEdit, error) {
	if err := p.editable(); err != nil {
		return nil, err
	}
	e, err := p.frame(fk)
	if err == nil {
		e.dirty = true
	}
	return e, err
}

// job reads a job once per projection.
func (p *projection) job(id string) (*coorddb.Job, error) {
	if e, ok := p.jobs[id]; ok {
		return e.j, nil
	}
	j, err := p.tx.Job(id)
	if err != nil {
		return nil, err
	}
	before := *j
	p.putJob(&jobEdit{before: &before, j: j})
	return j, nil
}

// addJob registers the job a submission creates; flush writes it.
func (p *projection) addJob(j *coorddb.Job) { p.putJob(&jobEdit{j: j, dirty: true}) }

func (p *projection) putJob(e *jobEdit) {
	if p.jobs == nil {
		p.jobs = map[string]*jobEdit{}
	}
	p.jobs[e.j.ID] = e
	p.jobOrder = append(p.jobOrder, e.j.ID)
}

// markJob makes flush write j, a job read through job or added.
func (p *projection) markJob(j *coorddb.Job) {
	if e, ok := p.jobs[j.ID]; ok && e.j == j {
		e.dirty = true
		return
	}
	p.putJob(&jobEdit{j: j, dirty: true})
}

// frame loads a frame; an unknown frame is coorddb.ErrNotFound.
func (p *projection) frame(fk string) (*frameEdit, error) {
	if e, ok := p.frames[fk]; ok {
		return e, nil
	}
	f, err := p.tx.Frame(fk)
	if err != nil {
		return nil, err
	}
	before := *f
	before.Done, before.History = slices.Clone(f.Done), nil
	e := &frameEdit{f: f, before: &before}
	p.frames[fk] = e
	p.order = append(p.order, fk)
	return e, nil
}

// lookup returns a frame as the projection has it.
func (p *projection) lookup(fk string) (*coorddb.Frame, error) {
	e, err := p.frame(fk)
	if err != nil {
		return nil, err
	}
	return e.f, nil
}

// add registers a frame that does not exist yet.
func (p *projection) add(f *coorddb.Frame) (*frameEdit, error) {
	if err := p.editable(); err != nil {
		return nil, err
	}
	e := &frameEdit{f: f, dirty: true}
	p.frames[f.Key] = e
	p.order = append(p.order, f.Key)
	return e, nil
}

func (p *projection) table(e *frameEdit) (coorddb.TileTable, error) {
	if e.table == nil {
		t, err := p.tx.TileTable(e.f)
		if err != nil {
			return nil, err
		}
		e.table = t
	}
	return e.table, nil
}

func (e *frameEdit) tileRects() ([]render.Rect, error) {
	if e.rects == nil {
		r, err := tiles.Split(e.f.Settings.Width, e.f.Settings.Height, e.f.TileSize)
		if err != nil {
			return nil, err
		}
		e.rects = r
	}
	return e.rects, nil
}

// tileUpdate is one change of one tile.
type tileUpdate struct {
	Index            int
	Change           coorddb.TileChange
	Order            coorddb.Order
	Failure          *coorddb.Failure // failed and dead-letter changes: what went wrong
	Attempt          string           // started, done: the attempt, whose recovered samples count once
	SamplesRecovered int              // started, done: samples the attempt resumed from a checkpoint
	SamplesRendered  int              // done: samples rendered by the attempt that promoted it
	Object           *wire.TileObject // done: the object promoted, as its worker reported it
	RenderMillis     int64            // done: how long that attempt rendered it; 0 unknown
}

// errUnknownTile is an update naming a tile its frame does not have.
var errUnknownTile = errors.New("unknown tile")

// tile applies u to tile u.Index of frame fk and keeps the frame's counters in step. It
// reports whether the tile's state changed.
func (p *projection) tile(fk string, u tileUpdate) (bool, error) {
	if err := p.editable(); err != nil {
		return false, err
	}
	e, err := p.frame(fk)
	if err != nil {
		return false, err
	}
	if u.Index < 0 || u.Index >= e.f.TilesTotal {
		return false, fmt.Errorf("frame %s has %d tiles, not %d: %w", fk, e.f.TilesTotal, u.Index+1, errUnknownTile)
	}
	t, err := p.table(e)
	if err != nil {
		return false, err
	}
	if err := p.recovered(e, u); err != nil {
		return false, err
	}
	cur, ord := t.Get(u.Index)
	next, nord, changed := coorddb.NextTileState(cur, ord, u.Change, u.Order)
	if !changed {
		return false, nil
	}
	t.Set(u.Index, next, nord)
	e.tableMod, e.dirty = true, true
	f := e.f
	if u.Change == coorddb.TileStarted {
		// A start that advanced the tile's order is an attempt not seen before.
		f.TileAttempts++
	}
	if next == cur {
		return false, nil
	}
	switch cur {
	case coorddb.TileDeadLettered:
		f.TilesFailed--
	case coorddb.TileCompleted: // unproven: its completion is taken back
		f.TilesCompleted--
		if err := p.setObject(e, u.Index, nil); err != nil {
			return false, err
		}
		if err := p.setTime(e, u.Index, 0); err != nil {
			return false, err
		}
	}
	switch next {
	case coorddb.TileDeadLettered:
		f.TilesFailed++
		p.tileDeadLetters++
	case coorddb.TileCompleted:
		f.TilesCompleted++
		f.SamplesRendered += u.SamplesRendered
		if u.Object != nil {
			if err := p.setObject(e, u.Index, u.Object); err != nil {
				return false, err
			}
		}
		if u.RenderMillis > 0 {
			if err := p.setTime(e, u.Index, uint32(min(u.RenderMillis, math.MaxUint32))); err != nil {
				return false, err
			}
		}
	}
	if u.Failure != nil && (next == coorddb.TileFailedRetryable || next == coorddb.TileDeadLettered) {
		u.Failure.DeadLettered = next == coorddb.TileDeadLettered
		if err := p.tx.AddFailure(fk, u.Index, *u.Failure); err != nil {
			return false, err
		}
		if u.Failure.Worker != "" {
			p.failed = append(p.failed, workerFailure{worker: u.Failure.Worker, f: workerFailureOf(f, u.Index, *u.Failure)})
		}
	}
	return true, nil
}

// recovered counts the samples a start or a completion reports resumed from a checkpoint,
// once per attempt (coorddb.Tx.AddResume), whether or not the update still changes the tile:
// a start that arrives after the tile's completion, or after a later attempt's start,
// resumed its samples all the same, and a completion counts them even before its start
// arrives. An update of no attempt id, or naming more samples than its frame's tiles take,
// counts nothing.
func (p *projection) recovered(e *frameEdit, u tileUpdate) error {
	if u.Change != coorddb.TileStarted && u.Change != coorddb.TileDone || u.SamplesRecovered <= 0 || u.SamplesRecovered > e.f.Settings.SPP ||
		u.Attempt == "" || len(u.Attempt) > coorddb.MaxAttemptID {
		return nil
	}
	news, err := p.tx.AddResume(e.f.Key, u.Attempt, u.SamplesRecovered)
	if err != nil || !news {
		return err
	}
	e.f.SamplesRecovered += u.SamplesRecovered
	e.dirty = true
	return nil
}

// setObject records tile i's promoted object (nil: forgets it).
func (p *projection) setObject(e *frameEdit, i int, o *wire.TileObject) error {
	if e.objects == nil {
		t, err := p.tx.TileObjects(e.f)
		if err != nil {
			return err
		}
		e.objects = t
	}
	if o == nil {
		e.objects.Forget(i)
	} else {
		e.objects = e.objects.Set(i, o.Attempt, o.SHA256, o.Build)
	}
	e.objectsMod = true
	return nil
}

// setTime records tile i's render time in milliseconds (0: forgets it), keeping the frame's
// sum in step. Render times are display data (docs/design.md, "Render times").
func (p *projection) setTime(e *frameEdit, i int, ms uint32) error {
	if e.times == nil {
		t, err := p.tx.TileTimes(e.f)
		if err != nil {
			return err
		}
		e.times = t
	}
	old := e.times.Get(i)
	if old == ms {
		return nil
	}
	e.f.RenderMillis += int64(ms) - int64(old)
	e.times.Set(i, ms)
	e.timesMod = true
	return nil
}

// tileChecked is tile for an update that names the tile by key too, as messages and events do:
// it applies only if tileKey really is tile u.Index of frame fk.
func (p *projection) tileChecked(fk, tileKey string, index int, u tileUpdate) error {
	if err := p.tileIndex(fk, tileKey, index); err != nil {
		return err
	}
	_, err := p.tile(fk, u)
	return err
}

// ignoreUnknown drops the error of a change about a frame or tile this coordinator does not
// have (another farm's, or forged): it changes nothing.
func ignoreUnknown(err error) error {
	if errors.Is(err, coorddb.ErrNotFound) || errors.Is(err, errUnknownTile) {
		return nil
	}
	return err
}

// tileIndex checks that tileKey is tile index of frame fk, so an event can only name a tile
// its frame really has.
func (p *projection) tileIndex(fk, tileKey string, index int) error {
	e, err := p.frame(fk)
	if err != nil {
		return err
	}
	rects, err := e.tileRects()
	if err != nil {
		return err
	}
	// One hash of the tile named, not the frame's hundreds.
	if index < 0 || index >= len(rects) || identity.TileKey(fk, rects[index]) != tileKey {
		return fmt.Errorf("tile %q is not tile %d of frame %s: %w", tileKey, index, fk, errUnknownTile)
	}
	return nil
}

// formatsDone records promoted outputs of frame fk. A frame completes once every format any
// job asked for is done; a job sees its own formats complete even before that.
func (p *projection) formatsDone(fk string, formats []string) error {
	e, err := p.edit(fk)
	if err != nil {
		return err
	}
	f := e.f
	for _, fm := range formats {
		if _, ok := layout.FrameOutputName(fm); ok && !slices.Contains(f.Done, fm) {
			f.Done = append(f.Done, fm)
		}
	}
	slices.Sort(f.Done)
	if coorddb.HasAll(f.Done, f.Formats) {
		f.AssemblyError = ""
	}
	return nil
}

// assemblyFailed records a dead-lettered assembly of frame fk; it does not fail formats that
// are promoted already.
func (p *projection) assemblyFailed(fk string, formats []string, errText string) error {
	e, err := p.edit(fk)
	if err != nil {
		return err
	}
	if coorddb.HasAll(e.f.Done, formats) {
		return nil
	}
	if e.f.AssemblyError == "" {
		p.assemblyDeadLetters++ // not a repeat of a dead letter already recorded
	}
	e.f.AssemblyError = errText
	e.f.AssemblyRequested = nil
	e.reason = "assembly: " + errText
	return nil
}

// assemblyRequeued records that a dead-lettered assembly asking for formats is back in the
// queue: the frame waits for it instead of asking for another.
func (p *projection) assemblyRequeued(fk string, formats []string) error {
	e, err := p.edit(fk)
	if err != nil {
		return err
	}
	e.f.AssemblyError = ""
	e.f.AssemblyRequested = slices.Clone(formats)
	return nil
}

// retry gives a failed frame another go: every dead-lettered tile goes back to queued and is
// dispatched again under a new dedup id (completed tiles are reused), and a failed assembly is
// asked for again. It reports whether anything was retried.
func (p *projection) retry(fk string, j *coorddb.Job) (bool, error) {
	e, err := p.edit(fk)
	if err != nil {
		return false, err
	}
	f := e.f
	retried := false
	if f.TilesFailed > 0 {
		n, err := p.redispatch(fk, j, func(_ int, s coorddb.TileState) bool { return s == coorddb.TileDeadLettered }, coorddb.TileRequeued, coorddb.Order{})
		if err != nil {
			return false, err
		}
		retried = n > 0
	}
	if f.AssemblyError != "" {
		f.AssemblyError = ""
		f.AssemblyRequested = nil
		retried = true
	}
	return retried, nil
}

// redispatch dispatches again, for job j and in its priority band, the tiles of frame fk whose
// state pick selects, under a new dedup id (the frame's next retry number), recording change
// at ord for each (coorddb.TileRequeued: dead-lettered ones go back to queued; coorddb.TileLost:
// their message is gone; coorddb.TileMoved at movedOrder: old copies may still queue, and none
// of their events counts any more). A copy of a tile still in the queue is harmless: whichever
// attempt promotes first wins, and the other finds the manifest. It returns how many it
// dispatched.
func (p *projection) redispatch(fk string, j *coorddb.Job, pick func(i int, s coorddb.TileState) bool, change coorddb.TileChange, ord coorddb.Order) (int, error) {
	e, err := p.edit(fk)
	if err != nil {
		return 0, err
	}
	t, err := p.table(e)
	if err != nil {
		return 0, err
	}
	var idx []int
	for i := 0; i < t.Len(); i++ {
		if s, _ := t.Get(i); pick(i, s) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return 0, nil
	}
	for _, i := range idx {
		if _, err := p.tile(fk, tileUpdate{Index: i, Change: change, Order: ord}); err != nil {
			return 0, err
		}
	}
	e.f.Retries++
	rec := coorddb.OutboxRecord{Kind: coorddb.OutboxTiles, FrameKey: fk, JobID: j.ID, Tiles: idx, Retry: e.f.Retries, Priority: j.Priority}
	if err := p.tx.AddOutbox(rec); err != nil {
		return 0, err
	}
	return len(idx), nil
}

// staleAssembly forgets the pending assembly request of frame fk, so flush asks again.
func (p *projection) staleAssembly(fk string) error {
	e, err := p.edit(fk)
	if err != nil {
		return err
	}
	e.f.AssemblyRequested = nil
	return nil
}

// flushStep is one feature of a flush, run over what the projection changed: its frames as
// stored before and as they are now (frameEdit), its jobs likewise (jobEdit). A step that edits
// may still change frames and ask for dispatches; once "write frames" has settled and written
// them, the steps only record what the change says (outbox records, jobs, notifications).
type flushStep struct {
	name  string
	edits bool
	run   func(p *projection) error
}

// flushSteps are the features of a flush in the order they run: the one place the order is
// written down (docs/design.md, "States"). A new feature of the projection is one entry here.
var flushSteps = []flushStep{
	// A frame that completed for a job starts the frames of the jobs waiting for it (deps.go).
	{name: "release waiting jobs", edits: true, run: (*projection).releaseWaiting},
	// A frame whose jobs changed (one joined, left, changed priority) or that was revived has
	// its tiles not started yet moved to where its jobs reach them (dispatch.go).
	{name: "move frames", edits: true, run: (*projection).moveFrames},
	// A frame whose tiles are all completed and that owes formats asks for its assembly.
	{name: "ask for assemblies", edits: true, run: (*projection).askAssemblies},
	// Each frame changed settles its state, and is written with its tile records.
	{name: "write frames", run: (*projection).writeFrames},
	// A job a frame completed for in this change asks for its preview movie (movie.go).
	{name: "ask for movies", run: (*projection).moviesDue},
	// Each job changed is written.
	{name: "write jobs", run: (*projection).writeJobs},
	// What became of jobs and frames is recorded for notification (announce.go).
	{name: "announce", run: (*projection).announce},
}

// flush runs flushSteps over the projection, in the caller's transaction. It reports whether
// any frame's state changed.
func (p *projection) flush() (bool, error) {
	for i := range flushSteps {
		s := &flushSteps[i]
		p.step = s
		if err := s.run(p); err != nil {
			return false, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return p.settled > 0, nil
}

// askAssemblies asks for the assembly of every frame changed whose tiles are all completed
// and whose formats are neither promoted nor asked for yet (Frame.NeedsAssembly).
func (p *projection) askAssemblies() error {
	for _, fk := range p.order {
		e := p.frames[fk]
		f := e.f
		if !e.dirty || !f.NeedsAssembly() {
			continue
		}
		f.Assemblies++
		f.AssemblyRequested = slices.Clone(f.Formats)
		jobID := ""
		if len(f.JobIDs) > 0 {
			jobID = f.JobIDs[len(f.JobIDs)-1]
		}
		if err := p.tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxAssemble, FrameKey: fk, JobID: jobID, Assembly: f.Assemblies}); err != nil {
			return err
		}
	}
	return nil
}

// writeFrames settles the state of every frame changed (recording its transition and why it
// fails, if it does) and writes it with its tile table, objects and times.
func (p *projection) writeFrames() error {
	for _, fk := range p.order {
		e := p.frames[fk]
		if !e.dirty {
			continue
		}
		f := e.f
		reason := ""
		if f.Derive() == coorddb.FrameFailed {
			reason = e.reason
		}
		before := f.State
		if f.Settle(reason, p.now) {
			p.settled++
			if f.State == coorddb.FrameCompleted && before != coorddb.FrameCompleted {
				p.framesCompleted++
			}
		}
		f.Updated = p.now
		if err := p.tx.PutFrame(f); err != nil {
			return err
		}
		if e.tableMod {
			if err := p.tx.PutTileTable(fk, e.table); err != nil {
				return err
			}
		}
		if e.objectsMod {
			if err := p.tx.PutTileObjects(fk, e.objects); err != nil {
				return err
			}
		}
		if e.timesMod {
			if err := p.tx.PutTileTimes(fk, e.times); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeJobs writes every job changed, in the order the projection first read it.
func (p *projection) writeJobs() error {
	for _, id := range p.jobOrder {
		if e := p.jobs[id]; e.dirty {
			if err := p.tx.PutJob(e.j); err != nil {
				return err
			}
			e.dirty = false
		}
	}
	return nil
}

// update runs fn on a projection in one transaction and flushes it, then counts what the
// projection counted, wakes the relay (a flush may have asked for an assembly, fn for a
// dispatch) and notifies the waiters: the one way an operator's change is written.
func (c *Coordinator) update(ctx context.Context, fn func(p *projection) error) error {
	var p *projection
	err := c.db.Update(ctx, func(tx *coorddb.Tx) error {
		p = c.newProjection(ctx, tx)
		if err := fn(p); err != nil {
			return err
		}
		_, err := p.flush()
		return err
	})
	if err == nil {
		c.counted(p)
		c.kickRelay()
		c.notify()
	}
	return err
}
