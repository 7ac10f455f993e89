package coorddb_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/render"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openStore opens a fresh database in a temp dir and returns it with its path.
func openStore(t *testing.T) (*coorddb.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "coordinator.db")
	s, err := coorddb.Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, path
}

func reopen(t *testing.T, s *coorddb.DB, path string) *coorddb.DB {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2, err := coorddb.Open(path)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	return s2
}

func testJob(id, key string, created time.Time) *coorddb.Job {
	return &coorddb.Job{ID: id, IdempotencyKey: key, PayloadHash: "ph-" + id, SceneVersion: "sv", Camera: "cam",
		First: 1, Last: 2, SettingsHash: "sh", Formats: []string{"png"}, Created: created,
		Settings: render.Settings{Camera: "cam", Width: 8, Height: 4, SPP: 2, MaxDepth: 3}}
}

func testFrame(key string, tiles int) *coorddb.Frame {
	return &coorddb.Frame{Key: key, Frame: 1, TileSize: 4, TilesTotal: tiles, Formats: []string{"png"},
		Settings: render.Settings{Camera: "cam", Width: 4 * tiles, Height: 4, SPP: 2, MaxDepth: 3}}
}

func TestUpdateRollsBackEveryWriteOnError(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx *coorddb.Tx) error {
		if err := tx.PutJob(testJob("job1", "key1", time.Now())); err != nil {
			return err
		}
		f := testFrame("f1", 2)
		if err := tx.PutFrame(f); err != nil {
			return err
		}
		table := coorddb.NewTileTable(2)
		table.Set(1, coorddb.TileCompleted, coorddb.Order{})
		if err := tx.PutTileTable("f1", table); err != nil {
			return err
		}
		if err := tx.AddFailure("f1", 0, coorddb.Failure{Code: "panic", Error: "x"}); err != nil {
			return err
		}
		for range 3 {
			if err := tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxTiles, FrameKey: "f1"}); err != nil {
				return err
			}
		}
		// Everything is visible inside the transaction before it fails.
		if _, err := tx.Job("job1"); err != nil {
			return fmt.Errorf("job not visible inside its own transaction: %v", err)
		}
		return fmt.Errorf("late failure: %w", boom)
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update = %v, want the callback's error", err)
	}
	s = reopen(t, s, path)
	counts, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for bucket, n := range counts {
		if n != 0 {
			t.Errorf("bucket %s holds %d records after a rolled-back transaction", bucket, n)
		}
	}
}

func TestUpdateCommitsEverythingTogether(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	err := s.Update(ctx, func(tx *coorddb.Tx) error {
		if err := tx.PutJob(testJob("job1", "key1", time.Now())); err != nil {
			return err
		}
		if err := tx.PutFrame(testFrame("f1", 3)); err != nil {
			return err
		}
		return tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxTiles, FrameKey: "f1", JobID: "job1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, path)
	err = s.View(ctx, func(tx *coorddb.Tx) error {
		if _, err := tx.Job("job1"); err != nil {
			return err
		}
		f, err := tx.Frame("f1")
		if err != nil {
			return err
		}
		table, err := tx.TileTable(f)
		if err != nil {
			return err
		}
		if table.Len() != 3 || table.Count(coorddb.TileQueued) != 3 {
			return fmt.Errorf("tile table of a new frame: %d tiles, %d queued; want 3 queued", table.Len(), table.Count(coorddb.TileQueued))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := s.PendingOutbox(ctx, 10)
	if err != nil || len(recs) != 1 || recs[0].FrameKey != "f1" || recs[0].JobID != "job1" || recs[0].Seq == 0 {
		t.Fatalf("outbox after reopen = %+v, %v", recs, err)
	}
}

func TestUpdateAndViewHonourCancelledContext(t *testing.T) {
	s, _ := openStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	if err := s.Update(ctx, func(*coorddb.Tx) error { called = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Update on a cancelled context = %v", err)
	}
	if err := s.View(ctx, func(*coorddb.Tx) error { called = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("View on a cancelled context = %v", err)
	}
	if called {
		t.Error("callback ran on a cancelled context")
	}
}

func TestOutboxOrderAndDelete(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	for i := range 5 {
		err := s.Update(ctx, func(tx *coorddb.Tx) error {
			return tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxAssemble, FrameKey: fmt.Sprintf("f%d", i), Assembly: i + 1})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.PendingOutbox(ctx, 3)
	if err != nil || len(recs) != 3 {
		t.Fatalf("PendingOutbox(3) = %d records, %v", len(recs), err)
	}
	for i, r := range recs {
		if r.FrameKey != fmt.Sprintf("f%d", i) || r.Assembly != i+1 {
			t.Errorf("record %d = %+v: not in write order", i, r)
		}
	}
	if err := s.DeleteOutbox(ctx, recs[0].Seq, recs[2].Seq); err != nil {
		t.Fatal(err)
	}
	rest, err := s.PendingOutbox(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rest {
		got = append(got, r.FrameKey)
	}
	if strings.Join(got, ",") != "f1,f3,f4" {
		t.Fatalf("after deleting two records the outbox holds %v", got)
	}
	if n, err := s.OutboxLen(ctx); err != nil || n != 3 {
		t.Fatalf("OutboxLen = %d, %v; want 3", n, err)
	}
}

func TestJobByIdempotencyKey(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	if err := s.Update(ctx, func(tx *coorddb.Tx) error { return tx.PutJob(testJob("job1", "key1", time.Now())) }); err != nil {
		t.Fatal(err)
	}
	err := s.View(ctx, func(tx *coorddb.Tx) error {
		j, err := tx.JobByIdempotencyKey("key1")
		if err != nil || j.ID != "job1" {
			return fmt.Errorf("JobByIdempotencyKey(key1) = %v, %v", j, err)
		}
		if _, err := tx.JobByIdempotencyKey("nope"); !errors.Is(err, coorddb.ErrNotFound) {
			return fmt.Errorf("unknown key: %v, want ErrNotFound", err)
		}
		if _, err := tx.Frame("nope"); !errors.Is(err, coorddb.ErrNotFound) {
			return fmt.Errorf("unknown frame: %v, want ErrNotFound", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The dependents of a job are exactly the jobs recorded as waiting for it, whatever other
// job ids share a prefix with it, and they survive a reopen.
func TestDependentsByUpstream(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	err := s.Update(ctx, func(tx *coorddb.Tx) error {
		for _, d := range [][2]string{{"job-a", "job-c"}, {"job-a", "job-b"}, {"job-ab", "job-x"}, {"job-b", "job-c"}} {
			if err := tx.AddDependent(d[0], d[1]); err != nil {
				return err
			}
		}
		return tx.AddDependent("job-a", "job-b") // twice is once
	})
	if err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, path)
	err = s.View(ctx, func(tx *coorddb.Tx) error {
		for up, want := range map[string][]string{"job-a": {"job-b", "job-c"}, "job-ab": {"job-x"}, "job-b": {"job-c"}, "job-c": nil} {
			if got := tx.Dependents(up); !slices.Equal(got, want) {
				return fmt.Errorf("Dependents(%s) = %v, want %v", up, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Upstream lists every job a job waits for once.
func TestJobUpstream(t *testing.T) {
	j := &coorddb.Job{After: []string{"job-a", "job-b"}, AfterFrames: "job-b"}
	if got := j.Upstream(); !slices.Equal(got, []string{"job-a", "job-b"}) {
		t.Fatalf("Upstream = %v", got)
	}
	j.AfterFrames = "job-c"
	if got := j.Upstream(); !slices.Equal(got, []string{"job-a", "job-b", "job-c"}) || len(j.After) != 2 {
		t.Fatalf("Upstream = %v, After %v", got, j.After)
	}
}

func TestJobFrameKeysAreDerived(t *testing.T) {
	j := testJob("job1", "key1", time.Now())
	a, b := j.FrameKey(1), j.FrameKey(2)
	if a == b || len(a) != 64 || j.Frames() != 2 {
		t.Fatalf("frame keys %q, %q of a %d-frame job", a, b, j.Frames())
	}
	j2 := *j
	j2.SettingsHash = "other"
	if j2.FrameKey(1) == a {
		t.Fatal("frame key does not depend on the settings hash")
	}
}

func TestJobsSortedByCreated(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"c", "a", "b"} {
		if err := s.Update(ctx, func(tx *coorddb.Tx) error {
			return tx.PutJob(testJob(id, "k"+id, base.Add(time.Duration(2-i)*time.Minute)))
		}); err != nil {
			t.Fatal(err)
		}
	}
	err := s.View(ctx, func(tx *coorddb.Tx) error {
		jobs, err := tx.Jobs()
		if err != nil {
			return err
		}
		var ids []string
		for _, j := range jobs {
			ids = append(ids, j.ID)
		}
		if strings.Join(ids, "") != "bac" {
			return fmt.Errorf("jobs in order %v, want oldest first b, a, c", ids)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestOpenLockedFails(t *testing.T) {
	_, path := openStore(t)
	start := time.Now()
	_, err := coorddb.Open(path)
	if err == nil || !strings.Contains(err.Error(), "locked by another coordinator") {
		t.Fatalf("second Open = %v, want a lock error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("second Open took %v", d)
	}
}

func TestOpenBadPath(t *testing.T) {
	if _, err := coorddb.Open(filepath.Join(t.TempDir(), "missing", "dir", "coordinator.db")); err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}

// The index of unfinished frames follows each frame's state: the reconciler's cost grows with
// unfinished frames only.
func TestOpenFramesFollowState(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	now := time.Now()
	err := s.Update(ctx, func(tx *coorddb.Tx) error {
		for _, k := range []string{"a", "b", "c"} {
			f := testFrame(k, 1)
			f.Settle("", now)
			if err := tx.PutFrame(f); err != nil {
				return err
			}
		}
		f, err := tx.Frame("b")
		if err != nil {
			return err
		}
		f.TilesCompleted, f.Done = 1, []string{"png"}
		f.Settle("", now)
		return tx.PutFrame(f)
	})
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	if err := s.View(ctx, func(tx *coorddb.Tx) error {
		tx.OpenFrames(func(k string) bool { open = append(open, k); return true })
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(open, ",") != "a,c" {
		t.Fatalf("open frames %v, want a,c (b is completed)", open)
	}
}

// Failure details stay bounded: the newest few per tile, each message truncated.
func TestFailuresAreBounded(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	long := strings.Repeat("x", 5000)
	err := s.Update(ctx, func(tx *coorddb.Tx) error {
		for i := range 10 {
			if err := tx.AddFailure("f1", 3, coorddb.Failure{Code: "panic", Error: fmt.Sprintf("%d %s", i, long)}); err != nil {
				return err
			}
		}
		var log []string
		for i := range 30 {
			log = append(log, fmt.Sprintf("line %d %s", i, strings.Repeat("y", 300)))
		}
		if err := tx.AddFailure("f1", 8, coorddb.Failure{Code: "retryable", Error: "x", Log: log}); err != nil {
			return err
		}
		if err := tx.AddFailure("f1", 9, coorddb.Failure{Code: "retryable", Error: "x", Log: []string{"first", long}}); err != nil {
			return err
		}
		return tx.AddFailure("f1", 7, coorddb.Failure{Code: "terminal", Error: "bad", Log: []string{"a", "b"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(ctx, func(tx *coorddb.Tx) error {
		// A failed attempt's log keeps its newest lines within 20 lines and 4 KiB; a line
		// longer than that alone keeps its end.
		logged, err := tx.TileFailures("f1", 8)
		if err != nil || len(logged) != 1 {
			return fmt.Errorf("failures of tile 8: %v, %v", logged, err)
		}
		size := 0
		for _, l := range logged[0].Log {
			size += len(l)
		}
		if l := logged[0].Log; len(l) == 0 || len(l) > 20 || size > 4096 || !strings.HasPrefix(l[len(l)-1], "line 29 ") {
			return fmt.Errorf("kept log of %d lines, %d bytes, ending %q; want the newest within 20 lines and 4 KiB", len(l), size, l[len(l)-1][:8])
		}
		if l, _ := tx.TileFailures("f1", 9); len(l) != 1 || len(l[0].Log) != 1 || len(l[0].Log[0]) != 4096 || !strings.HasSuffix(l[0].Log[0], "xxx") {
			return fmt.Errorf("the log of one overlong line kept %d lines, want its end in 4 KiB", len(l[0].Log))
		}
		if l, _ := tx.TileFailures("f1", 7); len(l) != 1 || strings.Join(l[0].Log, ",") != "a,b" {
			return fmt.Errorf("a short log kept as %v", l)
		}
		if l, err := tx.TileFailures("f1", 6); err != nil || l != nil {
			return fmt.Errorf("failures of a tile that never failed: %v, %v", l, err)
		}
		got, err := tx.Failures("f1")
		if err != nil {
			return err
		}
		if len(got) != 4 || len(got[3]) != 4 || len(got[7]) != 1 {
			return fmt.Errorf("failures = %d tiles, %d and %d entries; want 4 tiles, 4 and 1", len(got), len(got[3]), len(got[7]))
		}
		if !strings.HasPrefix(got[3][0].Error, "6 ") || len(got[3][3].Error) > 1100 {
			return fmt.Errorf("kept failures start with %q and are %d bytes; want the newest, truncated", got[3][0].Error[:4], len(got[3][3].Error))
		}
		if other, err := tx.Failures("f"); err != nil || len(other) != 0 {
			return fmt.Errorf("failures of a frame whose key prefixes another: %v, %v", other, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A corrupt tile table is reported, never trusted.
func TestTileTableRejectsWrongSize(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	err := s.Update(ctx, func(tx *coorddb.Tx) error {
		if err := tx.PutFrame(testFrame("f1", 3)); err != nil {
			return err
		}
		return tx.PutTileTable("f1", coorddb.NewTileTable(2))
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(ctx, func(tx *coorddb.Tx) error {
		f, err := tx.Frame("f1")
		if err != nil {
			return err
		}
		_, err = tx.TileTable(f)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "tile table") {
		t.Fatalf("TileTable of a wrong-size table = %v, want an error", err)
	}
}

// A job's fingerprint is a function of its stored record and its frames': the same while
// nothing is written, different after a write to the job or to any of its frames (a frame
// written with the same content keeps it), and another job's writes leave it alone.
func TestFingerprintFollowsTheJobAndItsFrames(t *testing.T) {
	ctx := testCtx(t)
	s, _ := openStore(t)
	j, other := testJob("job1", "key1", time.Now()), testJob("job2", "key2", time.Now())
	other.Camera = "cam2"
	fingerprint := func() (fp uint64) {
		t.Helper()
		if err := s.View(ctx, func(tx *coorddb.Tx) error { fp = tx.Fingerprint(j); return nil }); err != nil {
			t.Fatal(err)
		}
		return fp
	}
	update := func(fn func(tx *coorddb.Tx) error) {
		t.Helper()
		if err := s.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
	}
	frame := func(n, completed int) *coorddb.Frame {
		f := testFrame(j.FrameKey(n), 3)
		f.Frame, f.TilesCompleted = n, completed
		return f
	}
	noFrames := fingerprint() // nothing stored yet
	update(func(tx *coorddb.Tx) error { return tx.PutJob(j) })
	jobOnly := fingerprint()
	update(func(tx *coorddb.Tx) error { return tx.PutFrame(frame(1, 0)) })
	oneFrame := fingerprint()
	update(func(tx *coorddb.Tx) error { return tx.PutFrame(frame(2, 0)) })
	both := fingerprint()
	if fps := map[uint64]bool{noFrames: true, jobOnly: true, oneFrame: true, both: true}; len(fps) != 4 {
		t.Fatalf("fingerprints as the job and its frames were stored: %x %x %x %x, want four different", noFrames, jobOnly, oneFrame, both)
	}
	if again := fingerprint(); again != both {
		t.Fatalf("fingerprint changed with nothing written: %x, then %x", both, again)
	}
	update(func(tx *coorddb.Tx) error { return tx.PutFrame(frame(2, 0)) })
	if again := fingerprint(); again != both {
		t.Fatalf("a frame written with the same content changed the fingerprint: %x, then %x", both, again)
	}
	update(func(tx *coorddb.Tx) error {
		if err := tx.PutJob(other); err != nil {
			return err
		}
		return tx.PutFrame(testFrame(other.FrameKey(1), 3))
	})
	if again := fingerprint(); again != both {
		t.Fatalf("another job's writes changed the fingerprint: %x, then %x", both, again)
	}
	update(func(tx *coorddb.Tx) error { return tx.PutFrame(frame(2, 1)) })
	tileDone := fingerprint()
	if tileDone == both {
		t.Fatal("a tile completed in frame 2 left the fingerprint as it was")
	}
	j.Priority = 5
	update(func(tx *coorddb.Tx) error { return tx.PutJob(j) })
	if fingerprint() == tileDone {
		t.Fatal("a change to the job left the fingerprint as it was")
	}
}
