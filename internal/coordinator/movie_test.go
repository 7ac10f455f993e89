package coordinator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/finalize"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/layout"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
)

// promoteMovie promotes job id's movie as a worker would.
func (h *harness) promoteMovie(t *testing.T, id string) {
	t.Helper()
	if _, err := finalize.Promote(h.ctx, h.objects, layout.MovieKey(id), "attempt1", identity.BuildFingerprint(),
		[]finalize.Output{{Name: layout.MovieName, Data: []byte("movie of " + id)}}, nil); err != nil {
		t.Fatal(err)
	}
}

// fetchMovie takes the movie job from the assemblers, as a worker's assembly loop would,
// acking the frames' assemblies queued before it.
func (h *harness) fetchMovie(t *testing.T) jetstream.Msg {
	t.Helper()
	src := h.workerSources(t)
	for {
		msg, err := src.FetchAssembly(h.ctx, 5*time.Second)
		if err != nil || msg == nil {
			t.Fatalf("fetching the movie job from the assemblers: %v (message %v)", err, msg)
		}
		if wire.IsMovieJob(msg.Data()) {
			return msg
		}
		_ = msg.Ack()
	}
}

// The transaction that completes a job's last frame asks for its movie, once: not before, not
// again when the frame's completion is reported again. The relay publishes it on the assembly
// subject of the job's pool, under its dedup id, naming what derives the job's frames.
func TestMovieAskedForWhenTheJobCompletes(t *testing.T) {
	h := newHarness(t, Config{})
	id := h.submit(t, h.request(1, 2, 32, 16, 16)).Status.JobID
	if m := h.status(t, id).Movie; m.State != api.MoviePending || !strings.Contains(m.Reason, "waiting") {
		t.Fatalf("movie of a job just submitted: %+v, want pending, waiting for the job", m)
	}
	h.relay(t)
	h.finishFrame(t, id, 1)
	if n := h.outboxKinds(t)[coorddb.OutboxMovie]; n != 0 {
		t.Fatalf("%d movie records with frame 2 still to render", n)
	}
	h.finishFrame(t, id, 2)
	if n := h.outboxKinds(t)[coorddb.OutboxMovie]; n != 1 {
		t.Fatalf("%d movie records once the job completed, want 1", n)
	}
	if j := h.job(t, id); j.Movie != coorddb.MoviePending {
		t.Fatalf("job record's movie is %s once the job completed, want pending", j.Movie)
	}
	st := h.status(t, id)
	if st.State != api.JobCompleted || st.Movie.State != api.MoviePending || !strings.Contains(st.Movie.Reason, "encodes") {
		t.Fatalf("status once the job completed: %s, movie %+v", st.State, st.Movie)
	}
	fk := h.job(t, id).FrameKey(2)
	h.apply(t, wire.Event{ID: "again", Type: wire.EventFrameAssembled, FrameKey: fk, Formats: []string{"png"}})
	if n := h.outboxKinds(t)[coorddb.OutboxMovie]; n != 1 {
		t.Fatalf("%d movie records after the last frame was reported again, want still 1", n)
	}

	h.relay(t)
	msg := h.fetchMovie(t)
	if !queue.IsAssembleSubject(msg.Subject()) || queue.MsgID(msg.Headers()) != MovieMsgID(id) || !wire.IsMovieJob(msg.Data()) {
		t.Fatalf("movie message on %s with id %q: %s", msg.Subject(), queue.MsgID(msg.Headers()), msg.Data())
	}
	var job wire.MovieJob
	if err := json.Unmarshal(msg.Data(), &job); err != nil {
		t.Fatal(err)
	}
	j := h.job(t, id)
	if job.JobID != id || job.First != 1 || job.Last != 2 || job.Width != 32 || job.Height != 16 || job.FPS != MovieFPS ||
		identity.FrameKey(job.SceneVersion, job.Camera, 2, job.SettingsHash) != j.FrameKey(2) {
		t.Fatalf("movie job %+v does not name job %s's frames", job, id)
	}
}

// A movie.ready is believed only once the movie's manifest is in the store, through the real
// EVENTS stream; a ready movie is final, and the job's status serves its URL.
func TestMovieBelievedOnlyWithItsManifest(t *testing.T) {
	h := newHarness(t, Config{})
	id := h.submit(t, h.request(1, 1, 16, 16, 16)).Status.JobID
	h.finishFrame(t, id, 1)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	go func() { _ = h.c.consumeEvents(ctx) }()
	consumed := func(n uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, err := h.queue.Events.Consumer(h.ctx, consumerEvents)
			if err == nil {
				if ci, err := c.Info(h.ctx); err == nil && ci.AckFloor.Stream >= n {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("event %d not consumed in 10 s", n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	h.publishEvent(t, wire.Event{ID: "forged", Type: wire.EventMovieReady, JobID: id, Worker: "w1"})
	consumed(1)
	if m := h.job(t, id).Movie; m != coorddb.MoviePending {
		t.Fatalf("a movie.ready without a manifest made the movie %s", m)
	}
	h.promoteMovie(t, id)
	h.publishEvent(t, wire.Event{ID: "real", Type: wire.EventMovieReady, JobID: id, Worker: "w1"})
	consumed(2)
	if m := h.status(t, id).Movie; m.State != api.MovieReady || m.URL != "/v1/jobs/"+id+"/movie" {
		t.Fatalf("movie with its manifest: %+v, want ready at its URL", m)
	}
	h.publishEvent(t, wire.Event{ID: "late", Type: wire.EventMovieFailed, JobID: id, Terminal: true, Error: "boom"})
	consumed(3)
	if m := h.status(t, id).Movie; m.State != api.MovieReady {
		t.Fatalf("a late failure moved a ready movie to %+v", m)
	}
	data, err := h.c.Movie(h.ctx, id)
	if err != nil || string(data) != "movie of "+id {
		t.Fatalf("Movie = %q, %v", data, err)
	}
}

// A movie whose encoding is dead-lettered fails with its reason while its job stays
// completed; a retried failure changes nothing, and requeueing the dead letter makes it
// pending again.
func TestMovieFailureLeavesTheJobCompleted(t *testing.T) {
	h := newHarness(t, Config{})
	id := h.submit(t, h.request(1, 1, 16, 16, 16)).Status.JobID
	h.relay(t)
	h.finishFrame(t, id, 1)
	h.relay(t)
	msg := h.fetchMovie(t)
	h.apply(t, wire.Event{ID: "retried", Type: wire.EventMovieFailed, JobID: id, Error: "ffmpeg exited 1"})
	if m := h.status(t, id).Movie; m.State != api.MoviePending {
		t.Fatalf("a retried failure made the movie %+v", m)
	}
	const reason = "ffmpeg not found: install it (apt-get install ffmpeg)"
	if err := h.queue.DeadLetterNow(h.ctx, msg, reason); err != nil {
		t.Fatal(err)
	}
	h.apply(t, wire.Event{ID: "dead", Type: wire.EventMovieFailed, JobID: id, Terminal: true, Error: reason})
	st := h.status(t, id)
	if st.State != api.JobCompleted || st.Movie.State != api.MovieFailed || st.Movie.Reason != reason {
		t.Fatalf("status after the movie failed: %s, movie %+v", st.State, st.Movie)
	}
	if _, err := h.c.Movie(h.ctx, id); !strings.Contains(err.Error(), reason) || api.ExitCode(err) != api.ExitFailed {
		t.Fatalf("Movie of a failed movie: %v", err)
	}
	dls, err := h.queue.ListDeadLetters(h.ctx)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters: %v, %v", dls, err)
	}
	if err := h.c.RequeueDeadLetter(h.ctx, dls[0].DLQSeq); err != nil {
		t.Fatal(err)
	}
	if m := h.status(t, id).Movie; m.State != api.MoviePending {
		t.Fatalf("movie after its dead letter was requeued: %+v, want pending", m)
	}
	if _, err := h.c.Movie(h.ctx, id); api.ExitCode(err) != api.ExitInProgress {
		t.Fatalf("Movie of a pending movie: %v, want exit %d", err, api.ExitInProgress)
	}
}

// A job submitted with no movie, and a cancelled one, never ask for one and say why.
func TestMovieSkipped(t *testing.T) {
	h := newHarness(t, Config{})
	req := h.request(1, 1, 16, 16, 16)
	req.NoMovie = true
	id := h.submit(t, req).Status.JobID
	h.finishFrame(t, id, 1)
	if n := h.outboxKinds(t)[coorddb.OutboxMovie]; n != 0 {
		t.Fatalf("%d movie records for a job submitted with no movie", n)
	}
	if st := h.status(t, id); st.State != api.JobCompleted || st.Movie.State != api.MovieSkipped || !strings.Contains(st.Movie.Reason, "--no-movie") {
		t.Fatalf("status of a job with no movie: %s, movie %+v", st.State, st.Movie)
	}
	cancelled := h.submit(t, h.request(2, 2, 16, 16, 16)).Status.JobID
	if _, err := h.c.Cancel(h.ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	if m := h.status(t, cancelled).Movie; m.State != api.MovieSkipped || !strings.Contains(m.Reason, "cancelled") {
		t.Fatalf("movie of a cancelled job: %+v", m)
	}
}
