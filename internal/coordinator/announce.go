package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/notify"
)

// Announcing what happened to jobs (docs/design.md, "Notifications"): at the end of every
// flush, in the transaction of the change, the projection records an event for each job whose
// state became one that is announced, and for each frame of a job that asked for frame events
// that became completed or failed for it. The notifier (internal/notify) delivers them.

// announcedType is the event type of a job state that is announced, "" for one that is not.
func announcedType(s coorddb.JobState) string {
	switch s {
	case coorddb.JobCompleted:
		return notify.JobCompleted
	case coorddb.JobFailed:
		return notify.JobFailed
	case coorddb.JobCancelled:
		return notify.JobCancelled
	case coorddb.JobBlocked:
		return notify.JobBlocked
	}
	return ""
}

// frameEventType is the event type of a frame state announced to a job that asked for frame
// events, "" for one that is not.
func frameEventType(s coorddb.FrameState) string {
	switch s {
	case coorddb.FrameCompleted:
		return notify.FrameCompleted
	case coorddb.FrameFailed:
		return notify.FrameFailed
	}
	return ""
}

// touchJob makes flush settle job id's announcement even if none of its frames changed: for a
// change of the job record alone (a new job, a job blocked or unblocked by its dependencies). A
// job touched that has no announcement record yet gets one: it is announced from now on.
func (p *projection) touchJob(id string) {
	if !slices.Contains(p.touched, id) {
		p.touched = append(p.touched, id)
	}
}

// frameNews is a frame that became completed or failed for a job that asked for frame events.
type frameNews struct {
	f     *coorddb.Frame
	state coorddb.FrameState
}

// announce records the events of what this projection changed; flush calls it last, once every
// frame is written. A job's state can only become one that is announced when one of its frames
// becomes or stops being completed or failed for it, or its record says it is cancelled or
// given up (or it is touched), so only those jobs are settled; settling a job reads its frames
// from the newest until one is unfinished. Each job's record (coorddb.Announcement) holds the
// state last announced: applying the same change twice announces nothing twice, and a job
// failed, retried and failed again is announced failed twice.
func (p *projection) announce() error {
	jobs := map[string]*coorddb.Job{}
	var candidates []string
	news := map[string][]frameNews{}
	job := func(id string) (*coorddb.Job, error) {
		if j, ok := jobs[id]; ok {
			return j, nil
		}
		j, err := p.tx.Job(id)
		if err != nil && !errors.Is(err, coorddb.ErrNotFound) {
			return nil, err
		}
		jobs[id] = j // nil: a job of a frame that is gone; nothing to announce
		return j, nil
	}
	candidate := func(id string) {
		if !slices.Contains(candidates, id) {
			candidates = append(candidates, id)
		}
	}
	for _, id := range p.touched {
		candidate(id)
	}
	for _, fk := range p.order {
		e := p.frames[fk]
		if !e.dirty {
			continue
		}
		for _, id := range e.f.JobIDs {
			j, err := job(id)
			if err != nil {
				return err
			}
			if j == nil {
				continue
			}
			before := coorddb.FrameQueued
			if e.before != nil {
				before = e.before.StateFor(j.Formats)
			}
			after := e.f.StateFor(j.Formats)
			if frameEventType(before) != "" || frameEventType(after) != "" || !j.Cancelled.IsZero() || j.Failed != "" {
				candidate(id)
			}
			if j.NotifyFrames && after != before && frameEventType(after) != "" {
				news[id] = append(news[id], frameNews{f: e.f, state: after})
			}
		}
	}
	// A job whose announced state changed may block or unblock the jobs that wait for it
	// (docs/design.md, "Jobs that wait for jobs"), though none of their records changed: they
	// are settled after it, and theirs after them.
	for i := 0; i < len(candidates); i++ {
		id := candidates[i]
		j, err := job(id)
		if err != nil {
			return err
		}
		if j == nil {
			continue
		}
		changed, err := p.settleAnnouncement(j, news[id])
		if err != nil {
			return fmt.Errorf("announcing job %s: %w", id, err)
		}
		if changed {
			for _, down := range p.tx.Dependents(id) {
				candidate(down)
			}
		}
	}
	return nil
}

// settleAnnouncement records the frame events of job j and, if its state became one that is
// announced and not the one announced last, the job's event. It reports whether the state
// announced changed (to another, or to none).
func (p *projection) settleAnnouncement(j *coorddb.Job, frames []frameNews) (changed bool, err error) {
	a, ok, err := p.tx.Announcement(j.ID)
	if err != nil {
		return false, err
	}
	if !ok && !slices.Contains(p.touched, j.ID) {
		return false, nil // submitted before notifications: never announced
	}
	written := !ok
	for _, fn := range frames {
		n := fn.f.Frame
		ev := notify.Event{Type: frameEventType(fn.state), Time: p.now, JobID: j.ID, Project: j.Project,
			Scene: j.SceneName, State: string(apiFrameState(fn.state)), Frame: &n}
		if fn.state == coorddb.FrameFailed {
			ev.Reason = frameError(p.tx, fn.f)
		}
		if err := p.record(ev, j, &a); err != nil {
			return false, err
		}
		written = true
	}
	state, err := p.announcedState(j)
	if err != nil {
		return false, err
	}
	switch typ := announcedType(state); {
	case typ == "" && a.State != "":
		a.State, written, changed = "", true, true // not announced: the next announced state is news again
	case typ != "" && a.State != state.String():
		st, err := jobStatus(p.tx, j, p.peek)
		if err != nil {
			return false, err
		}
		ev := notify.Event{Type: typ, Time: p.now, JobID: j.ID, Project: j.Project, Scene: j.SceneName,
			State: string(st.State), Frames: &notify.Frames{Total: st.FramesTotal, Completed: st.FramesCompleted, Failed: st.FramesFailed}}
		switch {
		case st.State == api.JobBlocked:
			ev.Reason = st.BlockedReason
		case st.State != api.JobCompleted && len(st.Failures) > 0:
			ev.Reason = st.Failures[0]
		}
		if err := p.record(ev, j, &a); err != nil {
			return false, err
		}
		a.State, written, changed = state.String(), true, true
	}
	if !written {
		return false, nil
	}
	return changed, p.tx.PutAnnouncement(j.ID, a)
}

// announcedState is j's state for its announcements: for a job that waits for others, as its
// dependencies make it (blocked when one failed or was cancelled), reading its frames and
// theirs; for any other, settledJobState.
func (p *projection) announcedState(j *coorddb.Job) (coorddb.JobState, error) {
	if len(j.Upstream()) == 0 {
		return p.settledJobState(j)
	}
	u, err := newDepView(p.tx, p.peek).upstream(j.ID)
	if err != nil {
		return 0, err
	}
	return u.state, nil
}

// record records one event of job j, counted in a.
func (p *projection) record(ev notify.Event, j *coorddb.Job, a *coorddb.Announcement) error {
	if err := notify.Record(p.tx, ev, j.Notify); err != nil {
		return err
	}
	a.Events++
	p.notices++
	return nil
}

// settledJobState is j's state as far as announcements care: exact when every frame is
// completed or failed for it (or its record settles it), else the state Job.State gives a job
// with an unfinished frame. Frames are read from the newest, which finish last, so an
// unfinished job costs a frame or two.
func (p *projection) settledJobState(j *coorddb.Job) (coorddb.JobState, error) {
	step := max(j.Step, 1)
	states := make([]coorddb.FrameState, 0, 1)
	for i := j.Frames() - 1; i >= 0; i-- {
		f, err := p.peek(j.FrameKey(j.First + i*step))
		if err != nil {
			return 0, err
		}
		s := f.StateFor(j.Formats)
		if frameEventType(s) == "" {
			return j.State([]coorddb.FrameState{s}), nil
		}
		states = append(states, s)
	}
	return j.State(states), nil
}

// peek returns a frame as the projection has it, without taking it into the projection: for
// reading frames flush has written already.
func (p *projection) peek(fk string) (*coorddb.Frame, error) {
	if e, ok := p.frames[fk]; ok {
		return e.f, nil
	}
	return p.tx.Frame(fk)
}

// checkNotify checks a submission's receivers (each an http or https URL, at most
// notify.MaxURLs) and returns them without repeats. A farm with no secret to sign with takes
// none: its deliveries could only fail. A receiver whose host is, or resolves to, an address a
// job's receivers may not reach (loopback, link-local, cloud metadata, unspecified, unless
// serve --notify-allow allows it: notify.CheckReach) is bad input, so a submitter learns at
// once; the notifier checks every address it dials as well.
func (c *Coordinator) checkNotify(ctx context.Context, urls []string) ([]string, error) {
	if len(urls) == 0 {
		return nil, nil
	}
	if err := notify.CheckURLs(urls); err != nil {
		return nil, badInput("%v", err)
	}
	if len(c.cfg.Notify.Secret) == 0 {
		return nil, fmt.Errorf("%w: this farm sends no webhooks: its coordinator has no notification secret (serve --notify-secret-file or %s)", api.ErrConflict, notify.EnvSecret)
	}
	var out []string
	for _, u := range urls {
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, checkReachTimeout)
	defer cancel()
	for _, u := range out {
		if err := notify.CheckReach(ctx, u, c.cfg.Notify.Allow); err != nil {
			return nil, badInput("%v", err)
		}
	}
	return out, nil
}

// checkReachTimeout bounds resolving a submission's receivers: a name not resolved in time is
// accepted and checked at each dial instead.
const checkReachTimeout = 5 * time.Second
