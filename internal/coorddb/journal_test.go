package coorddb_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// memLog is a journal kept in memory, refusing an append whose after is not its last entry,
// as the farm's log on JetStream does (docs/design.md, "Replication").
type memLog struct {
	entries [][]byte
	refuse  error // returned by the next Append, once
}

func (l *memLog) Append(_ context.Context, after uint64, changes []byte) (uint64, error) {
	if err := l.refuse; err != nil {
		l.refuse = nil
		return 0, err
	}
	if after != uint64(len(l.entries)) {
		return 0, errors.New("wrong last sequence")
	}
	l.entries = append(l.entries, bytes.Clone(changes))
	return uint64(len(l.entries)), nil
}

// follow applies every entry of l that db does not hold yet.
func (l *memLog) follow(t *testing.T, db *coorddb.DB) {
	t.Helper()
	ctx := testCtx(t)
	from, err := db.Applied(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := from + 1; seq <= uint64(len(l.entries)); seq++ {
		if err := db.Apply(ctx, seq, l.entries[seq-1]); err != nil {
			t.Fatalf("Apply %d: %v", seq, err)
		}
	}
}

func snapshot(t *testing.T, db *coorddb.DB) []byte {
	t.Helper()
	snap, _, err := db.Snapshot(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// writeEverything writes a record of every kind the database keeps, and deletes some.
func writeEverything(t *testing.T, db *coorddb.DB, id string) {
	t.Helper()
	ctx := testCtx(t)
	j := testJob(id, "key-"+id, time.Unix(1700000000, 0).UTC())
	f := testFrame(j.FrameKey(1), 3)
	err := db.Update(ctx, func(tx *coorddb.Tx) error {
		if err := tx.PutJob(j); err != nil {
			return err
		}
		if err := tx.PutFrame(f); err != nil {
			return err
		}
		if err := tx.AddDependent(id, "down-"+id); err != nil {
			return err
		}
		tt := coorddb.NewTileTable(3)
		if err := tx.PutTileTable(f.Key, tt); err != nil {
			return err
		}
		if _, err := tx.AddResume(f.Key, "attempt-"+id, 7); err != nil {
			return err
		}
		if err := tx.AddFailure(f.Key, 1, coorddb.Failure{Error: "boom"}); err != nil {
			return err
		}
		if err := tx.AddNotification(coorddb.Notification{ID: "ev-" + id}); err != nil {
			return err
		}
		for range 3 {
			if err := tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxTiles, FrameKey: f.Key, JobID: id}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := db.PendingOutbox(ctx, 2)
	if err != nil || len(recs) != 2 {
		t.Fatalf("outbox: %v %v", recs, err)
	}
	if err := db.DeleteOutbox(ctx, recs[0].Seq, recs[1].Seq); err != nil {
		t.Fatal(err)
	}
	f.State = coorddb.FrameCompleted // leaves the index of open frames: a delete
	if err := db.Update(ctx, func(tx *coorddb.Tx) error { return tx.PutFrame(f) }); err != nil {
		t.Fatal(err)
	}
}

// TestAFollowerHoldsWhatTheLeaderWrote proves the journal's property: a database that applies
// every entry another wrote holds the same records, bucket sequences included, so it numbers
// its next outbox record as the writer would.
func TestAFollowerHoldsWhatTheLeaderWrote(t *testing.T) {
	ctx := testCtx(t)
	leader, _ := openStore(t)
	follower, fpath := openStore(t)
	log := &memLog{}
	leader.SetJournal(log)
	writeEverything(t, leader, "j1")
	writeEverything(t, leader, "j2")
	if len(log.entries) == 0 {
		t.Fatal("the leader journaled nothing")
	}
	log.follow(t, follower)
	if a, b := snapshot(t, leader), snapshot(t, follower); !bytes.Equal(a, b) {
		t.Fatalf("the follower's records differ from the leader's: %d bytes against %d", len(b), len(a))
	}
	if n, _ := follower.Applied(ctx); n != uint64(len(log.entries)) {
		t.Fatalf("follower applied %d of %d entries", n, len(log.entries))
	}
	// The follower takes over: it journals from where the log is, its sequences the leader's.
	follower = reopen(t, follower, fpath)
	follower.SetJournal(log)
	add := func(db *coorddb.DB) {
		if err := db.Update(ctx, func(tx *coorddb.Tx) error {
			return tx.AddOutbox(coorddb.OutboxRecord{Kind: coorddb.OutboxTiles, FrameKey: "next", JobID: "j3"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	add(follower)
	leader.SetJournal(nil) // the old leader, told the same change by hand
	add(leader)
	if a, b := snapshot(t, leader), snapshot(t, follower); !bytes.Equal(a, b) {
		t.Fatal("the follower numbered its next outbox record unlike the leader")
	}
	// The old leader, journaling again from its stale position, is refused and writes nothing.
	stale, _ := openStore(t)
	stale.SetJournal(log)
	if err := stale.Update(ctx, func(tx *coorddb.Tx) error { return tx.AddDependent("x", "y") }); err == nil {
		t.Fatal("a database behind the log appended to it")
	}
	if snap := snapshot(t, stale); bytes.Contains(snap, []byte("x/y")) {
		t.Fatal("a refused append was committed")
	}
}

// TestAJournalRefusalRollsBack: what the journal refuses is not committed, and an update that
// wrote nothing journals nothing.
func TestAJournalRefusalRollsBack(t *testing.T) {
	ctx := testCtx(t)
	db, _ := openStore(t)
	log := &memLog{refuse: errors.New("not the leader")}
	db.SetJournal(log)
	err := db.Update(ctx, func(tx *coorddb.Tx) error { return tx.PutJob(testJob("j", "k", time.Now())) })
	if err == nil || err.Error() != "not the leader" {
		t.Fatalf("Update = %v, want the journal's refusal", err)
	}
	if err := db.View(ctx, func(tx *coorddb.Tx) error { _, err := tx.Job("j"); return err }); !errors.Is(err, coorddb.ErrNotFound) {
		t.Fatalf("the refused job was stored: %v", err)
	}
	if err := db.Update(ctx, func(tx *coorddb.Tx) error { return nil }); err != nil || len(log.entries) != 0 {
		t.Fatalf("an empty update journaled %d entries (%v)", len(log.entries), err)
	}
}

// TestASnapshotRebuildsADatabase: a snapshot applied over a database with other records makes
// it equal to the one snapshotted, and a cut entry is refused whole.
func TestASnapshotRebuildsADatabase(t *testing.T) {
	ctx := testCtx(t)
	src, _ := openStore(t)
	writeEverything(t, src, "j1")
	dst, _ := openStore(t)
	writeEverything(t, dst, "other")
	snap, empty, err := src.Snapshot(ctx)
	if err != nil || empty {
		t.Fatalf("Snapshot: empty %v, %v", empty, err)
	}
	if err := dst.Apply(ctx, 41, snap[:len(snap)-3]); !errors.Is(err, coorddb.ErrBadJournal) {
		t.Fatalf("a cut snapshot: %v, want ErrBadJournal", err)
	}
	if err := dst.Apply(ctx, 42, snap); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snapshot(t, src), snapshot(t, dst)) {
		t.Fatal("the snapshot did not rebuild the database")
	}
	if n, _ := dst.Applied(ctx); n != 42 {
		t.Fatalf("applied %d, want 42", n)
	}
	fresh, _ := openStore(t)
	if _, empty, _ := fresh.Snapshot(ctx); !empty {
		t.Fatal("a fresh database's snapshot is not empty")
	}
}
