package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// Jobs that wait for jobs (docs/design.md, "Jobs that wait for jobs"). A job submitted with
// After waits for those jobs to complete; with AfterFrames, its frame N waits for frame N of
// that job. Its frames are recorded at submit but not dispatched: a new frame is held
// (coorddb.Frame.Held, no outbox record), a frame another job asked for is shared but not
// revived or retried for it. Whether a frame may start is derived, never stored: what it
// waits for completed (depView.dep). The moment it becomes so is always a frame completing
// for the job waited for, so projection.releaseWaiting, in the flush of the transaction that
// completed it, starts the frames that may start now (startFrame: through the outbox, the one
// way to dispatch). Waiting and blocked are derived the same way for status: a failure, a
// cancel, a retry or a requeue of the job waited for shows at once, with nothing to undo.

// Bounds of what a submission names to wait for: how many jobs, and how long a job id may be
// (ids are "job-" and 24 hex digits; a longer one is no job).
const (
	maxAfter = 64
	maxJobID = 64
)

// normalizeAfter checks and sorts the jobs a submission names to wait for.
func normalizeAfter(after []string, afterFrames string) ([]string, string, error) {
	var out []string
	for _, id := range after {
		if id = strings.TrimSpace(id); id != "" && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	if len(out) > maxAfter {
		return nil, "", badInput("after: %d jobs, at most %d", len(out), maxAfter)
	}
	afterFrames = strings.TrimSpace(afterFrames)
	for _, id := range append(slices.Clone(out), afterFrames) {
		if len(id) > maxJobID {
			return nil, "", badInput("after: %.24q... is not a job id", id)
		}
	}
	slices.Sort(out)
	return out, afterFrames, nil
}

// checkDeps refuses a job that waits for a job the coordinator does not know, for itself, or
// for a job that waits for it, directly or through others: the jobs it names must all be
// able to complete without it.
func checkDeps(tx *coorddb.Tx, j *coorddb.Job) error {
	for _, id := range j.Upstream() {
		if id == j.ID {
			return badInput("job %s cannot wait for itself", id)
		}
		if _, err := tx.Job(id); errors.Is(err, coorddb.ErrNotFound) {
			return badInput("no job %q to wait for", id)
		} else if err != nil {
			return err
		}
	}
	// Each job named, then the jobs they wait for: a path back to j is a cycle. from[k] is the
	// job that led to k, to name the cycle.
	from := map[string]string{}
	queue := j.Upstream()
	for _, id := range queue {
		from[id] = j.ID
	}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		k, err := tx.Job(id)
		if errors.Is(err, coorddb.ErrNotFound) {
			continue
		} else if err != nil {
			return err
		}
		for _, up := range k.Upstream() {
			if up == j.ID {
				var chain []string
				for at := id; at != j.ID; at = from[at] {
					chain = append(chain, at)
				}
				slices.Reverse(chain)
				path := slices.Concat([]string{j.ID}, chain, []string{j.ID})
				return badInput("dependency cycle: %s", strings.Join(path, " waits for "))
			}
			if _, seen := from[up]; !seen {
				from[up] = id
				queue = append(queue, up)
			}
		}
	}
	return nil
}

// depView evaluates what jobs wait for over one transaction's records, reading each job
// waited for once: its state and its frames as it sees them (itself behind what it waits for).
type depView struct {
	tx    *coorddb.Tx
	frame func(fk string) (*coorddb.Frame, error)
	jobs  map[string]*upstreamJob // nil while being evaluated
}

// upstreamJob is a job waited for, as its dependents see it.
type upstreamJob struct {
	job    *coorddb.Job
	state  coorddb.JobState
	frames map[int]coorddb.FrameState
	reason string // why it is blocked, when it is
}

func newDepView(tx *coorddb.Tx, frame func(fk string) (*coorddb.Frame, error)) *depView {
	return &depView{tx: tx, frame: frame, jobs: map[string]*upstreamJob{}}
}

// upstream evaluates job id.
func (v *depView) upstream(id string) (*upstreamJob, error) {
	if u, ok := v.jobs[id]; ok {
		if u == nil {
			return nil, fmt.Errorf("dependency cycle through job %s", id)
		}
		return u, nil
	}
	v.jobs[id] = nil
	j, err := v.tx.Job(id)
	if err != nil {
		return nil, fmt.Errorf("job %s waited for: %w", id, err)
	}
	u := &upstreamJob{job: j, frames: make(map[int]coorddb.FrameState, j.Frames())}
	states := make([]coorddb.FrameState, 0, j.Frames())
	var waiting, blocked []int
	for n := range j.FrameNumbers() {
		f, err := v.frame(j.FrameKey(n))
		if err != nil {
			return nil, fmt.Errorf("job %s frame %d: %w", id, n, err)
		}
		s, err := v.frameState(j, f)
		if err != nil {
			return nil, err
		}
		u.frames[n] = s
		states = append(states, s)
		waiting, blocked = sortFrame(waiting, blocked, n, s)
	}
	u.state = j.State(states)
	if u.state == coorddb.JobBlocked {
		_, u.reason, err = v.describe(j, waiting, blocked)
		if err != nil {
			return nil, err
		}
	}
	v.jobs[id] = u
	return u, nil
}

// sortFrame adds frame n to waiting or blocked by its state.
func sortFrame(waiting, blocked []int, n int, s coorddb.FrameState) ([]int, []int) {
	switch s {
	case coorddb.FrameWaiting:
		waiting = append(waiting, n)
	case coorddb.FrameBlocked:
		blocked = append(blocked, n)
	}
	return waiting, blocked
}

// frameState is frame f as job j sees it: with j's formats, behind what j waits for.
func (v *depView) frameState(j *coorddb.Job, f *coorddb.Frame) (coorddb.FrameState, error) {
	s := f.StateFor(j.Formats)
	if s == coorddb.FrameCompleted || (len(j.After) == 0 && j.AfterFrames == "") {
		return s, nil
	}
	d, err := v.dep(j, f.Frame)
	return s.Behind(d), err
}

// dep is where what frame n of job j waits for stands: every job of j.After, and frame n of
// j.AfterFrames (the whole job if it has no frame n).
func (v *depView) dep(j *coorddb.Job, n int) (coorddb.DepState, error) {
	d := coorddb.DepSatisfied
	for _, id := range j.After {
		u, err := v.upstream(id)
		if err != nil {
			return d, err
		}
		d = d.And(coorddb.DepOnJob(u.state))
	}
	if j.AfterFrames != "" {
		u, err := v.upstream(j.AfterFrames)
		if err != nil {
			return d, err
		}
		d = d.And(u.frameDep(n))
	}
	return d, nil
}

// frameDep is where waiting for frame n of u stands: its frame n, blocked if u was cancelled
// or given up without it; the whole of u if u has no frame n.
func (u *upstreamJob) frameDep(n int) coorddb.DepState {
	s, ok := u.frames[n]
	if !ok {
		return coorddb.DepOnJob(u.state)
	}
	d := coorddb.DepOnFrame(s)
	if d == coorddb.DepWaiting && coorddb.DepOnJob(u.state) == coorddb.DepBlocked {
		return coorddb.DepBlocked
	}
	return d
}

// describe says what job j waits for and what blocks it, given its frames that wait and
// those blocked: "job X, frames 3-5 of job Y" and "job X failed; frame 2 of job Y failed".
func (v *depView) describe(j *coorddb.Job, waiting, blocked []int) (waitingFor, blockedBy string, err error) {
	if len(waiting)+len(blocked) == 0 {
		return "", "", nil
	}
	var waits, blocks []string
	for _, id := range j.After {
		u, err := v.upstream(id)
		if err != nil {
			return "", "", err
		}
		switch coorddb.DepOnJob(u.state) {
		case coorddb.DepWaiting:
			waits = append(waits, "job "+id)
		case coorddb.DepBlocked:
			blocks = append(blocks, u.blocking())
		}
	}
	if id := j.AfterFrames; id != "" {
		u, err := v.upstream(id)
		if err != nil {
			return "", "", err
		}
		var wait, failed, stuck []int
		whole := false
		for _, n := range slices.Concat(waiting, blocked) {
			s, has := u.frames[n]
			switch d := u.frameDep(n); {
			case d == coorddb.DepWaiting && has:
				wait = append(wait, n)
			case d == coorddb.DepWaiting:
				whole = true
			case d == coorddb.DepBlocked && has && s == coorddb.FrameFailed && u.state != coorddb.JobCancelled:
				failed = append(failed, n)
			case d == coorddb.DepBlocked && has && s == coorddb.FrameBlocked:
				stuck = append(stuck, n)
			case d == coorddb.DepBlocked:
				blocks = append(blocks, u.blocking())
			}
		}
		if len(wait) > 0 {
			waits = append(waits, framesOf(wait)+" of job "+id)
		}
		if whole {
			waits = append(waits, "job "+id)
		}
		if len(failed) > 0 {
			blocks = append(blocks, framesOf(failed)+" of job "+id+" failed")
		}
		if len(stuck) > 0 {
			blocks = append(blocks, framesOf(stuck)+" of job "+id+" blocked")
		}
	}
	return strings.Join(distinct(waits), ", "), strings.Join(distinct(blocks), "; "), nil
}

// distinct keeps the first of each string, in order.
func distinct(s []string) []string {
	var out []string
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// blocking says why waiting for u is blocked.
func (u *upstreamJob) blocking() string {
	switch u.state {
	case coorddb.JobCancelled:
		return "job " + u.job.ID + " was cancelled"
	case coorddb.JobBlocked:
		return "job " + u.job.ID + " is blocked (" + u.reason + ")"
	}
	return "job " + u.job.ID + " failed"
}

// framesOf names frame numbers in order as ranges: "frame 3", "frames 1-4, 7".
func framesOf(frames []int) string {
	frames = slices.Clone(frames)
	slices.Sort(frames)
	frames = slices.Compact(frames)
	var parts []string
	for i := 0; i < len(frames); {
		k := i
		for k+1 < len(frames) && frames[k+1] == frames[k]+1 {
			k++
		}
		part := strconv.Itoa(frames[i])
		if k > i {
			part += "-" + strconv.Itoa(frames[k])
		}
		parts = append(parts, part)
		i = k + 1
	}
	if len(frames) == 1 {
		return "frame " + parts[0]
	}
	return "frames " + strings.Join(parts, ", ")
}

// startFrame has frame e render for job j now: a held frame is dispatched as a new frame, a
// dropped one revived, a failed one retried (as a new job on it does); a frame rendering or
// completed for another job needs nothing.
func (c *Coordinator) startFrame(p *projection, e *frameEdit, j *coorddb.Job) error {
	f := e.f
	e.dirty = true
	switch {
	case f.Dropped:
		// Revived: flush's "move frames" step moves its tiles (moveFrames).
		f.Dropped, f.Held = false, false
		return nil
	case f.Held:
		f.Held = false
		return p.tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxTiles, FrameKey: f.Key, JobID: j.ID, Priority: j.Priority, First: true})
	case f.Derive() == coorddb.FrameFailed:
		_, err := p.retry(f.Key, j)
		return err
	}
	return nil
}

// releaseWaiting starts the frames of waiting jobs that may start now. A frame of a job may
// start once all it waits for completed; the last of those to complete is a job completing or
// a frame completing for its job, which only happens here, in a flush, when a frame's formats
// for a job are all promoted (formatsDone). So for each job a frame completed for in this
// projection, each job waiting for it is checked: the same frame if it waits frame by frame,
// every frame if the whole job just completed. A frame checked may start only now (one of the
// conditions it waits for became true in this transaction), so none is started twice. It runs
// in the transaction that completed the frame: a crash loses no release, and the outbox
// dispatches what it started (docs/design.md, "Jobs that wait for jobs").
func (p *projection) releaseWaiting() error {
	type completion struct {
		up    *coorddb.Job
		frame int
	}
	var completions []completion
	for _, fk := range p.order {
		e := p.frames[fk]
		if len(e.f.Done) == len(e.doneBefore()) { // Done only grows
			continue
		}
		for _, id := range e.f.JobIDs {
			u, err := p.job(id)
			if errors.Is(err, coorddb.ErrNotFound) {
				continue
			} else if err != nil {
				return err
			}
			if e.completedFor(u) {
				completions = append(completions, completion{u, e.f.Frame})
			}
		}
	}
	every := map[string]bool{}        // jobs to check at every frame
	some := map[string]map[int]bool{} // jobs to check at some frames
	for _, c := range completions {
		for _, id := range p.tx.Dependents(c.up.ID) {
			d, err := p.job(id)
			if err != nil {
				return err
			}
			if d.AfterFrames == c.up.ID && d.HasFrame(c.frame) {
				if some[id] == nil {
					some[id] = map[int]bool{}
				}
				some[id][c.frame] = true
			}
			after := slices.Contains(d.After, c.up.ID)
			if every[id] || (!after && d.AfterFrames != c.up.ID) {
				continue
			}
			done, err := p.jobDone(c.up)
			if err != nil || !done {
				if err != nil {
					return err
				}
				continue
			}
			// The whole job completed now: every frame waiting for it may start, and so may
			// the frames of a job waiting frame by frame for it that it has none of.
			if after {
				every[id] = true
				continue
			}
			for n := range d.FrameNumbers() {
				if !c.up.HasFrame(n) {
					if some[id] == nil {
						some[id] = map[int]bool{}
					}
					some[id][n] = true
				}
			}
		}
	}
	check := map[string]bool{}
	for id, all := range every {
		check[id] = all
	}
	for id := range some {
		check[id] = true
	}
	ids := slices.Sorted(maps.Keys(check))
	for _, id := range ids {
		d, err := p.job(id)
		if err != nil {
			return err
		}
		if !check[id] || !d.Cancelled.IsZero() || d.Failed != "" {
			continue
		}
		frames := slices.Sorted(maps.Keys(some[id]))
		if every[id] {
			frames = slices.Collect(d.FrameNumbers())
		}
		started := 0
		for _, n := range frames {
			ok, err := p.satisfied(d, n)
			if err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			e, err := p.edit(d.FrameKey(n))
			if err != nil {
				return fmt.Errorf("job %s frame %d: %w", d.ID, n, err)
			}
			if err := p.c.startFrame(p, e, d); err != nil {
				return err
			}
			started++
		}
		if started > 0 {
			p.c.log.Info("frames of a waiting job released", "job_id", d.ID, "frames", started)
		}
	}
	return nil
}

// jobDone reports whether job j is completed: not cancelled, every frame completed with its
// formats. Frames are read from the last, which in a job rendered in order is the last to
// complete, so a job not done yet costs one frame read.
func (p *projection) jobDone(j *coorddb.Job) (bool, error) {
	if done, ok := p.done[j.ID]; ok {
		return done, nil
	}
	done := j.Cancelled.IsZero()
	for n := j.Last; done && n >= j.First; n-- {
		if !j.HasFrame(n) {
			continue
		}
		f, err := p.lookup(j.FrameKey(n))
		if err != nil {
			return false, err
		}
		done = f.StateFor(j.Formats) == coorddb.FrameCompleted
	}
	if p.done == nil {
		p.done = map[string]bool{}
	}
	p.done[j.ID] = done
	return done, nil
}

// satisfied reports whether everything frame n of job d waits for completed: what
// depView.dep says satisfied of, read from the projection.
func (p *projection) satisfied(d *coorddb.Job, n int) (bool, error) {
	for _, id := range d.After {
		u, err := p.job(id)
		if err != nil {
			return false, err
		}
		if done, err := p.jobDone(u); err != nil || !done {
			return false, err
		}
	}
	if d.AfterFrames == "" {
		return true, nil
	}
	u, err := p.job(d.AfterFrames)
	if err != nil {
		return false, err
	}
	if !u.HasFrame(n) {
		return p.jobDone(u)
	}
	f, err := p.lookup(u.FrameKey(n))
	if err != nil {
		return false, err
	}
	return f.StateFor(u.Formats) == coorddb.FrameCompleted, nil
}
