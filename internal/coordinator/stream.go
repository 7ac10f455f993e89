package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// The event stream (GET /v1/events) tells a viewer what changed so it fetches only what it
// shows. Its traffic is bounded: at most one message per streamEvery, holding the statuses
// (without frames) of the jobs that changed since the last one and the frames whose tiles
// changed, and nothing when nothing changed but a heartbeat comment every streamHeartbeat.
const (
	streamEvery     = 500 * time.Millisecond
	streamHeartbeat = 15 * time.Second
	// streamPoll looks again without a projection change, for what moves outside it: the
	// samples of tiles in progress and the ETA.
	streamPoll = 2 * time.Second
	// defaultStreamMax ends a stream after this long; the viewer reconnects and gets every job
	// again, so a stream never outlives a server that should have let it go.
	defaultStreamMax = 10 * time.Minute
)

// StopStreams ends every event stream, for a server shutting down: streams would otherwise
// hold its graceful shutdown until they end by themselves.
func (c *Coordinator) StopStreams() { c.stopStreams.Do(func() { close(c.streamsDone) }) }

// streamState is what one stream sent last: each job's status as sent, each frame's, and the
// fingerprint of the records each job's frames were sent from.
type streamState struct {
	jobs         map[string][]byte
	frames       map[frameOfJob]api.FrameEvent
	fingerprints map[string]uint64
}

// frameOfJob names a frame of a job.
type frameOfJob struct {
	job   string
	frame int
}

// jobsWithFrames is Jobs with each job's frames, and the fingerprint of each job's records
// (coorddb.Tx.FingerprintFrames).
func (c *Coordinator) jobsWithFrames(ctx context.Context) ([]api.Status, []uint64, error) {
	var out []api.Status
	var fps []uint64
	inProgress := c.progress.samples()
	err := c.db.View(ctx, func(tx *coorddb.Tx) error {
		jobs, err := tx.Jobs()
		if err != nil {
			return err
		}
		ids := make(map[string]bool, len(jobs))
		all := c.statuses.fingerprints(tx, jobs)
		for i, j := range jobs {
			st, fp, err := c.statuses.statusAt(tx, j, all[i])
			if err != nil {
				return err
			}
			addProgress(&st, inProgress)
			out = append(out, st)
			fps = append(fps, fp)
			ids[j.ID] = true
		}
		c.statuses.keepOnly(ids)
		return nil
	})
	for i := range out {
		c.observe(&out[i])
	}
	return out, fps, err
}

// next computes the message that brings a viewer from s up to now, and records it sent; nil
// when nothing changed. fps are the fingerprints of all's records: a frame event is made of a
// frame's stored record alone, so the frames of a job whose fingerprint is the one last sent
// are not looked at again (a look costs what changed, not every frame of every job).
func (s *streamState) next(all []api.Status, fps []uint64) ([]byte, error) {
	var changed []api.Status
	var frames []api.FrameEvent
	for i, st := range all {
		if last, ok := s.fingerprints[st.JobID]; !ok || last != fps[i] {
			s.fingerprints[st.JobID] = fps[i]
			for _, f := range st.Frames {
				ev := api.FrameEvent{JobID: st.JobID, Frame: f.Frame, State: f.State, TilesCompleted: f.TilesCompleted, TilesFailed: f.TilesFailed}
				key := frameOfJob{st.JobID, f.Frame}
				if old, ok := s.frames[key]; !ok || old != ev {
					s.frames[key] = ev
					frames = append(frames, ev)
				}
			}
		}
		st.Frames = nil
		b, err := json.Marshal(st)
		if err != nil {
			return nil, fmt.Errorf("encoding status: %w", err)
		}
		if !bytes.Equal(s.jobs[st.JobID], b) {
			s.jobs[st.JobID] = b
			changed = append(changed, st)
		}
	}
	if len(changed) == 0 && len(frames) == 0 {
		return nil, nil
	}
	var buf bytes.Buffer
	if len(changed) > 0 {
		b, err := json.Marshal(changed)
		if err != nil {
			return nil, fmt.Errorf("encoding statuses: %w", err)
		}
		fmt.Fprintf(&buf, "event: jobs\ndata: %s\n\n", b)
	}
	if len(frames) > 0 {
		b, err := json.Marshal(frames)
		if err != nil {
			return nil, fmt.Errorf("encoding frames: %w", err)
		}
		fmt.Fprintf(&buf, "event: frame\ndata: %s\n\n", b)
	}
	return buf.Bytes(), nil
}

// handleEvents serves the event stream: first every job (and every frame), then what changed,
// at most once per streamEvery, until the client goes, the stream's time is up or the server
// stops.
func (c *Coordinator) handleEvents(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, "retry: 2000\n: tilefarm events, at most one message per %v\n\n", streamEvery); err != nil {
		return
	}
	_ = rc.Flush()
	end := time.NewTimer(c.streamMax)
	defer end.Stop()
	s := &streamState{jobs: map[string][]byte{}, frames: map[frameOfJob]api.FrameEvent{}, fingerprints: map[string]uint64{}}
	lastWrite := time.Now()
	for {
		changed := c.Changed()
		all, fps, err := c.jobsWithFrames(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("event stream: reading statuses", "err", err)
			}
			return
		}
		msg, err := s.next(all, fps)
		if err != nil {
			c.log.Warn("event stream", "err", err)
			return
		}
		if msg != nil {
			if _, err := w.Write(msg); err != nil {
				return
			}
			_ = rc.Flush()
			lastWrite = time.Now()
		}
		// At most one message per streamEvery, whatever changes.
		select {
		case <-ctx.Done():
			return
		case <-c.streamsDone:
			return
		case <-end.C:
			return
		case <-time.After(streamEvery):
		}
		select {
		case <-ctx.Done():
			return
		case <-c.streamsDone:
			return
		case <-end.C:
			return
		case <-changed:
		case <-time.After(min(streamPoll, time.Until(lastWrite.Add(streamHeartbeat)))):
			if time.Since(lastWrite) >= streamHeartbeat {
				if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
					return
				}
				_ = rc.Flush()
				lastWrite = time.Now()
			}
		}
	}
}
