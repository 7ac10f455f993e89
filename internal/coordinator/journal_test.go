package coordinator

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/metrics"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// standbyOf is a second coordinator of h's farm, with a database of its own, run until the
// test ends.
func standbyOf(t *testing.T, h *harness) *harness {
	t.Helper()
	st, err := coorddb.Open(filepath.Join(t.TempDir(), "coordinator.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m := metrics.NewCoordinator(metrics.NewRegistry())
	s := &harness{c: New(Config{}, Deps{DB: st, Queue: h.queue, Kinds: scene.Kinds{jsonscene.Kind{}}, NATS: h.c.nc, Objects: h.objects, Metrics: m, Log: h.c.log}),
		st: st, objects: h.objects, queue: h.queue, js: h.js, m: m, ctx: h.ctx, version: h.version}
	s.run(t)
	return s
}

// sameRecords waits until b holds a's records, byte for byte: the leader's relay writes as it
// publishes, so they are compared until both have settled.
func sameRecords(t *testing.T, a, b *harness) {
	t.Helper()
	var sa, sb []byte
	for deadline := time.Now().Add(20 * time.Second); ; {
		var err error
		if sa, _, err = a.st.Snapshot(a.ctx); err != nil {
			t.Fatal(err)
		}
		if sb, _, err = b.st.Snapshot(b.ctx); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(sa, sb) {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ca, _ := a.st.Counts(a.ctx)
	cb, _ := b.st.Counts(b.ctx)
	t.Fatalf("the standby's records (%d bytes, %v) differ from the leader's (%d bytes, %v)", len(sb), cb, len(sa), ca)
}

// Property: a coordinator that does not lead holds the leader's records, byte for byte, from
// the farm's journal; after the leader compacted it (a snapshot, the entries before it
// purged), a coordinator joining the farm rebuilds them from the snapshot and follows what
// comes after it (docs/design.md, "Replication").
func TestAStandbyHoldsTheLeadersRecordsAcrossACompaction(t *testing.T) {
	h := newHarness(t, Config{})
	h.run(t)
	for !h.c.journal.leading.Load() {
		time.Sleep(10 * time.Millisecond)
	}
	s1 := standbyOf(t, h)
	for i := range 3 {
		h.submit(t, h.request(1, 2+i, 32, 18, 16))
	}
	// A job of many frames: its transaction goes to the journal in several parts.
	h.submit(t, h.request(1, 1500, 32, 18, 32))
	sameRecords(t, h, s1)
	if !journalHasParts(t, h) {
		t.Fatal("no journal set of several parts: the big submission fit in one")
	}
	if s1.c.journal.leading.Load() {
		t.Fatal("both coordinators lead")
	}
	st, err := s1.c.Status(h.ctx, h.job(t, firstJob(t, h)).ID)
	if err != nil || st.TilesTotal == 0 {
		t.Fatalf("the standby's status of the leader's job: %+v, %v", st, err)
	}

	before, err := h.queue.Journal.Info(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.compactJournal(h.ctx); err != nil {
		t.Fatal(err)
	}
	after, err := h.queue.Journal.Info(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.FirstSeq <= before.State.LastSeq {
		t.Fatalf("compaction left entries %d-%d of %d-%d", after.State.FirstSeq, after.State.LastSeq, before.State.FirstSeq, before.State.LastSeq)
	}
	// What is left begins with the snapshot (the relay may have written since).
	if m, err := h.queue.Journal.GetMsg(h.ctx, after.State.FirstSeq); err != nil || !coorddb.IsSnapshot(m.Data) {
		t.Fatalf("the journal's first entry after compaction is no snapshot (%v)", err)
	}
	s2 := standbyOf(t, h) // joins after the purge: only the snapshot is left to rebuild from
	h.submit(t, h.request(4, 4, 32, 18, 16))
	sameRecords(t, h, s1)
	sameRecords(t, h, s2)
}

// firstJob is the id of the oldest job h holds.
func firstJob(t *testing.T, h *harness) string {
	t.Helper()
	var id string
	if err := h.st.View(h.ctx, func(tx *coorddb.Tx) error {
		jobs, err := tx.Jobs()
		if len(jobs) > 0 {
			id = jobs[0].ID
		}
		return err
	}); err != nil || id == "" {
		t.Fatalf("no job: %v", err)
	}
	return id
}

// journalHasParts reports whether some set of h's journal was written in several parts.
func journalHasParts(t *testing.T, h *harness) bool {
	t.Helper()
	info, err := h.queue.Journal.Info(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := h.queue.Journal.GetMsg(h.ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if _, n, ok := journalPlace(m.Header.Get(hdrJournalPart)); ok && n > 1 {
			return true
		}
	}
	return false
}
