package coorddb_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/coorddb"
)

// The notification outbox keeps what is owed byte for byte across a reopen, lists it in the
// order it was recorded from any point, and forgets a notification once nothing of it is owed;
// a job's announcement record is there only once written.
func TestNotificationOutbox(t *testing.T) {
	ctx := testCtx(t)
	s, path := openStore(t)
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	err := s.Update(ctx, func(tx *coorddb.Tx) error {
		for i, id := range []string{"ev1", "ev2", "ev3"} {
			n := coorddb.Notification{ID: id, Subject: "notify.job.completed.j", Body: json.RawMessage(`{"id":"` + id + `"}`),
				URLs: []string{"https://example.com/hook"}, Created: t0.Add(time.Duration(i) * time.Second)}
			if err := tx.AddNotification(n); err != nil {
				return err
			}
		}
		if _, ok, err := tx.Announcement("j"); ok || err != nil {
			t.Errorf("announcement of a job never announced: ok %v, %v", ok, err)
		}
		return tx.PutAnnouncement("j", coorddb.Announcement{State: "completed", Events: 3})
	})
	if err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, path)
	all, err := s.Notifications(ctx, 0, 10)
	if err != nil || len(all) != 3 {
		t.Fatalf("Notifications = %v, %v", all, err)
	}
	if all[0].ID != "ev1" || string(all[1].Body) != `{"id":"ev2"}` || all[2].URLs[0] != "https://example.com/hook" || !all[0].Due().Equal(t0) {
		t.Fatalf("notifications read back as %+v", all)
	}
	rest, err := s.Notifications(ctx, all[0].Seq, 10)
	if err != nil || len(rest) != 2 || rest[0].ID != "ev2" {
		t.Fatalf("notifications after the first = %+v, %v", rest, err)
	}
	// Expanded with targets: due at the earliest target's next try; with none left: gone.
	n := all[1]
	n.Expanded = true
	n.Targets = []coorddb.Delivery{{To: coorddb.NATSTarget, Next: t0.Add(time.Hour)}, {To: "https://example.com/hook", Attempts: 2, Next: t0.Add(time.Minute)}}
	if !n.Due().Equal(t0.Add(time.Minute)) {
		t.Fatalf("Due = %v, want the earliest target's", n.Due())
	}
	if err := s.PutNotification(ctx, n); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Notification(ctx, n.Seq)
	if err != nil || !ok || len(got.Targets) != 2 || got.Targets[1].Attempts != 2 {
		t.Fatalf("Notification = %+v, %v, %v", got, ok, err)
	}
	got.Targets = nil
	if err := s.PutNotification(ctx, got); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Notification(ctx, n.Seq); ok || err != nil {
		t.Fatalf("a notification with nothing owed is still there: %v, %v", ok, err)
	}
	if k, err := s.NotificationsLen(ctx); err != nil || k != 2 {
		t.Fatalf("NotificationsLen = %d, %v; want 2", k, err)
	}
	err = s.View(ctx, func(tx *coorddb.Tx) error {
		a, ok, err := tx.Announcement("j")
		if err != nil || !ok || a != (coorddb.Announcement{State: "completed", Events: 3}) {
			t.Errorf("announcement = %+v, %v, %v", a, ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
