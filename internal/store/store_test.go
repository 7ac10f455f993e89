package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/store"
	"github.com/tilefarm/tilefarm/render"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openStore opens a fresh database in a temp dir and returns it with its path.
func openStore(t *testing.T) (*store.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "coordinator.db")
	s, err := store.Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, path
}

func reopen(t *testing.T, s *store.Store, path string) *store.Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2, err := store.Open(path)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	return s2
}

func testJob(id, key string, created time.Time) *store.Job {
	return &store.Job{ID: id, IdempotencyKey: key, PayloadHash: "ph-" + id, SceneVersion: "sv", Camera: "cam",
		First: 1, Last: 2, FrameKeys: []string{"f1", "f2"}, Formats: []string{"png"}, Created: created,
		Settings: render.Settings{Camera: "cam", Width: 8, Height: 4, SPP: 2, MaxDepth: 3}}
}

func TestUpdateRollsBackEveryWriteOnError(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx *store.Tx) error {
		if err := tx.PutJob(testJob("job1", "key1", time.Now())); err != nil {
			return err
		}
		if err := tx.PutFrame(&store.Frame{Key: "f1", Frame: 1, TileSize: 4, TilesTotal: 1}); err != nil {
			return err
		}
		if err := tx.PutTile(&store.Tile{Key: "t1", FrameKey: "f1", Rect: render.Rect{X1: 4, Y1: 4}}); err != nil {
			return err
		}
		for i := range 3 {
			if err := tx.AddOutbox("tiles.render", fmt.Sprintf("m%d", i), []byte("x")); err != nil {
				return err
			}
		}
		if seen, err := tx.SeenEvent("ev1", time.Now()); err != nil || seen {
			return fmt.Errorf("SeenEvent inside tx = %v, %v; want false, nil", seen, err)
		}
		// Everything is visible inside the transaction before it fails.
		if _, err := tx.Job("job1"); err != nil {
			return fmt.Errorf("job not visible inside its own transaction: %v", err)
		}
		return fmt.Errorf("late failure: %w", boom)
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update = %v, want the error returned by fn", err)
	}
	checkRolledBack := func(st *store.Store) {
		t.Helper()
		if n, err := st.OutboxLen(ctx); err != nil || n != 0 {
			t.Errorf("OutboxLen after rollback = %d, %v; want 0", n, err)
		}
		if recs, err := st.PendingOutbox(ctx, 10); err != nil || len(recs) != 0 {
			t.Errorf("PendingOutbox after rollback = %v, %v; want none", recs, err)
		}
		err := st.View(ctx, func(tx *store.Tx) error {
			if _, err := tx.Job("job1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Job after rollback: %v, want ErrNotFound", err)
			}
			if _, err := tx.JobByIdempotencyKey("key1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("JobByIdempotencyKey after rollback: %v, want ErrNotFound", err)
			}
			if _, err := tx.Frame("f1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Frame after rollback: %v, want ErrNotFound", err)
			}
			if _, err := tx.Tile("t1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Tile after rollback: %v, want ErrNotFound", err)
			}
			if jobs, err := tx.Jobs(); err != nil || len(jobs) != 0 {
				t.Errorf("Jobs after rollback = %d jobs, %v; want none", len(jobs), err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("View: %v", err)
		}
	}
	checkRolledBack(s)
	s = reopen(t, s, path)
	checkRolledBack(s)
	// The rolled-back event mark is gone too: the event would be applied on redelivery.
	err = s.Update(ctx, func(tx *store.Tx) error {
		seen, err := tx.SeenEvent("ev1", time.Now())
		if err == nil && seen {
			t.Errorf("event marked by a rolled-back transaction is still seen")
		}
		return err
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func TestUpdateCommitsEverythingTogether(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	err := s.Update(ctx, func(tx *store.Tx) error {
		if err := tx.PutJob(testJob("job1", "key1", time.Now())); err != nil {
			return err
		}
		if err := tx.PutTile(&store.Tile{Key: "t1", FrameKey: "f1", Rect: render.Rect{X0: 1, Y0: 2, X1: 3, Y1: 4}}); err != nil {
			return err
		}
		return tx.AddOutbox("tiles.render", "t1", []byte("payload"))
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	s = reopen(t, s, path)
	if n, err := s.OutboxLen(ctx); err != nil || n != 1 {
		t.Errorf("OutboxLen = %d, %v; want 1", n, err)
	}
	err = s.View(ctx, func(tx *store.Tx) error {
		j, err := tx.Job("job1")
		if err != nil {
			return err
		}
		if j.IdempotencyKey != "key1" || len(j.FrameKeys) != 2 || j.Settings.SPP != 2 {
			t.Errorf("job read back = %+v", j)
		}
		tl, err := tx.Tile("t1")
		if err != nil {
			return err
		}
		if tl.Rect != (render.Rect{X0: 1, Y0: 2, X1: 3, Y1: 4}) {
			t.Errorf("tile rect read back = %+v", tl.Rect)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
}

func TestUpdateAndViewHonourCancelledContext(t *testing.T) {
	s, _ := openStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := s.Update(ctx, func(*store.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Update with cancelled ctx = %v, want context.Canceled", err)
	}
	if err := s.View(ctx, func(*store.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("View with cancelled ctx = %v, want context.Canceled", err)
	}
	if ran {
		t.Error("fn ran despite a cancelled context")
	}
}

func TestOutboxOrderAndDelete(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	// 300 records cross a byte boundary of the sequence, which a non-big-endian key would misorder.
	const n = 300
	add := func(from, to int) {
		t.Helper()
		err := s.Update(ctx, func(tx *store.Tx) error {
			for i := from; i < to; i++ {
				subj := "tiles.render"
				if i%7 == 0 {
					subj = "tiles.assemble"
				}
				if err := tx.AddOutbox(subj, fmt.Sprintf("msg-%03d", i), []byte(fmt.Sprintf("data-%d", i))); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Update: %v", err)
		}
	}
	add(0, 120)
	add(120, n)
	recs, err := s.PendingOutbox(ctx, 1000)
	if err != nil {
		t.Fatalf("PendingOutbox: %v", err)
	}
	if len(recs) != n {
		t.Fatalf("PendingOutbox returned %d records, want %d", len(recs), n)
	}
	for i, r := range recs {
		if r.MsgID != fmt.Sprintf("msg-%03d", i) || string(r.Data) != fmt.Sprintf("data-%d", i) {
			t.Fatalf("record %d = %s %q, want msg-%03d (written order)", i, r.MsgID, r.Data, i)
		}
		if wantSubj := map[bool]string{true: "tiles.assemble", false: "tiles.render"}[i%7 == 0]; r.Subject != wantSubj {
			t.Errorf("record %d subject %q, want %q", i, r.Subject, wantSubj)
		}
		if i > 0 && r.Seq <= recs[i-1].Seq {
			t.Fatalf("sequence not increasing: %d after %d", r.Seq, recs[i-1].Seq)
		}
	}
	if first3, err := s.PendingOutbox(ctx, 3); err != nil || len(first3) != 3 || first3[2].MsgID != "msg-002" {
		t.Errorf("PendingOutbox(limit 3) = %v, %v; want the first three", first3, err)
	}

	// Delete the first and a middle record: the rest keeps its order.
	for _, i := range []int{0, 150} {
		if err := s.DeleteOutbox(ctx, recs[i].Seq); err != nil {
			t.Fatalf("DeleteOutbox(%d): %v", recs[i].Seq, err)
		}
	}
	if err := s.DeleteOutbox(ctx, recs[0].Seq); err != nil {
		t.Errorf("deleting an already deleted record: %v, want nil (the relay may retry)", err)
	}
	s = reopen(t, s, path)
	if got, err := s.OutboxLen(ctx); err != nil || got != n-2 {
		t.Errorf("OutboxLen = %d, %v; want %d", got, err, n-2)
	}
	rest, err := s.PendingOutbox(ctx, 1000)
	if err != nil {
		t.Fatalf("PendingOutbox: %v", err)
	}
	var want []string
	for i := range n {
		if i != 0 && i != 150 {
			want = append(want, fmt.Sprintf("msg-%03d", i))
		}
	}
	if len(rest) != len(want) {
		t.Fatalf("after delete: %d records, want %d", len(rest), len(want))
	}
	for i := range want {
		if rest[i].MsgID != want[i] {
			t.Fatalf("after delete: record %d is %s, want %s", i, rest[i].MsgID, want[i])
		}
	}

	// New records go after the old ones even after a reopen.
	add(n, n+1)
	all, err := s.PendingOutbox(ctx, 1000)
	if err != nil {
		t.Fatalf("PendingOutbox: %v", err)
	}
	if last := all[len(all)-1]; last.MsgID != fmt.Sprintf("msg-%03d", n) || last.Seq <= recs[n-1].Seq {
		t.Errorf("record added after reopen = %+v, want it last with a higher sequence", last)
	}
}

func TestJobByIdempotencyKey(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	now := time.Now().UTC()
	err := s.Update(ctx, func(tx *store.Tx) error {
		if err := tx.PutJob(testJob("job-a", "key-a", now)); err != nil {
			return err
		}
		return tx.PutJob(testJob("job-b", "key-b", now))
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	err = s.View(ctx, func(tx *store.Tx) error {
		for key, id := range map[string]string{"key-a": "job-a", "key-b": "job-b"} {
			j, err := tx.JobByIdempotencyKey(key)
			if err != nil {
				t.Errorf("JobByIdempotencyKey(%q): %v", key, err)
				continue
			}
			if j.ID != id || j.PayloadHash != "ph-"+id {
				t.Errorf("JobByIdempotencyKey(%q) = job %s (payload %s), want %s", key, j.ID, j.PayloadHash, id)
			}
		}
		if _, err := tx.JobByIdempotencyKey("job-a"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("looking up a job id as a key: %v, want ErrNotFound", err)
		}
		if _, err := tx.JobByIdempotencyKey("nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown key: %v, want ErrNotFound", err)
		}
		if _, err := tx.Job("nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("unknown job: %v, want ErrNotFound", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("View: %v", err)
	}
}

func TestSeenEventMarksOnce(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	seen := func(id string) bool {
		t.Helper()
		var got bool
		err := s.Update(ctx, func(tx *store.Tx) error {
			var err error
			got, err = tx.SeenEvent(id, time.Now())
			return err
		})
		if err != nil {
			t.Fatalf("SeenEvent(%q): %v", id, err)
		}
		return got
	}
	err := s.Update(ctx, func(tx *store.Tx) error {
		first, err := tx.SeenEvent("e1", time.Now())
		if err != nil {
			return err
		}
		second, err := tx.SeenEvent("e1", time.Now())
		if err != nil {
			return err
		}
		if first || !second {
			t.Errorf("SeenEvent in one tx: first %v, second %v; want false, true", first, second)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if !seen("e1") {
		t.Error("e1 not seen in a later transaction")
	}
	if seen("e2") {
		t.Error("e2 seen before it was ever applied")
	}
	s = reopen(t, s, path)
	if !seen("e1") || !seen("e2") {
		t.Error("event marks lost on reopen")
	}
	if seen("e3") {
		t.Error("e3 seen before it was ever applied")
	}
}

func TestJobsSortedByCreated(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	// Keys sort a < b < c < d; creation order is c, a, d, b.
	created := map[string]time.Time{
		"c": base,
		"a": base.Add(time.Second),
		"d": base.Add(time.Minute),
		"b": base.Add(time.Hour),
	}
	err := s.Update(ctx, func(tx *store.Tx) error {
		for id, at := range created {
			if err := tx.PutJob(testJob(id, "key-"+id, at)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	var got []string
	err = s.View(ctx, func(tx *store.Tx) error {
		jobs, err := tx.Jobs()
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		return err
	})
	if err != nil {
		t.Fatalf("Jobs: %v", err)
	}
	if strings.Join(got, ",") != "c,a,d,b" {
		t.Errorf("Jobs order = %v, want [c a d b] (oldest first)", got)
	}
}

func TestOpenLockedFails(t *testing.T) {
	s, path := openStore(t)
	start := time.Now()
	s2, err := store.Open(path)
	if err == nil {
		s2.Close()
		t.Fatal("second Open of a database in use succeeded")
	}
	if !strings.Contains(err.Error(), "locked by another coordinator") || !strings.Contains(err.Error(), path) {
		t.Errorf("second Open error = %q, want it to name the file and say it is locked", err)
	}
	if waited := time.Since(start); waited > 15*time.Second {
		t.Errorf("second Open took %v: it must give up after a short wait", waited)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s3, err := store.Open(path)
	if err != nil {
		t.Fatalf("Open after the first one closed: %v", err)
	}
	s3.Close()
}

func TestOpenBadPath(t *testing.T) {
	_, err := store.Open(filepath.Join(t.TempDir(), "missing-dir", "x.db"))
	if err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
	if !strings.Contains(err.Error(), "missing-dir") {
		t.Errorf("error %q does not name the path", err)
	}
}

func TestTileAndFrameMove(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tl := &store.Tile{Key: "t"}
	tl.Move(store.TileQueued, "", "", "", now)
	if tl.Terminal() {
		t.Error("queued tile is terminal")
	}
	tl.Move(store.TileFailedRetryable, "a1", "w1", "disk full", now)
	if tl.Terminal() || tl.Worker != "w1" || tl.Error != "disk full" {
		t.Errorf("after retryable failure: %+v", tl)
	}
	tl.Move(store.TileRendering, "a2", "w2", "", now.Add(time.Second))
	if tl.Error != "" {
		t.Errorf("error %q kept after moving on", tl.Error)
	}
	for _, term := range []string{store.TileCompleted, store.TileFailedTerminal, store.TileDeadLettered} {
		c := *tl
		c.Move(term, "a3", "w3", "", now)
		if !c.Terminal() {
			t.Errorf("tile in %s is not terminal", term)
		}
	}
	if len(tl.History) != 3 || tl.History[1].Attempt != "a1" || tl.History[2].State != store.TileRendering ||
		!tl.History[2].Time.Equal(now.Add(time.Second)) {
		t.Errorf("history = %+v", tl.History)
	}

	f := &store.Frame{Key: "f"}
	for _, s := range []string{store.FrameQueued, store.FrameRendering, store.FrameAssembling} {
		f.Move(s, "", now)
		if f.Terminal() {
			t.Errorf("frame in %s is terminal", s)
		}
	}
	f.Move(store.FrameFailed, "tile x dead-lettered", now)
	if !f.Terminal() || f.Error != "tile x dead-lettered" || len(f.History) != 4 {
		t.Errorf("failed frame = %+v", f)
	}
	f.Move(store.FrameCompleted, "", now)
	if !f.Terminal() || f.Error != "" {
		t.Errorf("completed frame = %+v", f)
	}
}

func TestPruneEventsForgetsOnlyOldIDs(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, recent := time.Now().Add(-30*24*time.Hour), time.Now()
	if err := s.Update(ctx, func(tx *store.Tx) error {
		if _, err := tx.SeenEvent("old", old); err != nil {
			return err
		}
		_, err := tx.SeenEvent("recent", recent)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	n, err := s.PruneEvents(ctx, time.Now().Add(-8*24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("pruned %d (%v), want 1", n, err)
	}
	_ = s.Update(ctx, func(tx *store.Tx) error {
		if seen, _ := tx.SeenEvent("recent", recent); !seen {
			t.Error("a recent event id was forgotten")
		}
		if seen, _ := tx.SeenEvent("old", recent); seen {
			t.Error("an old event id was kept")
		}
		return nil
	})
}
