package queue

import (
	"errors"
	"testing"
	"time"
)

func TestLeaseAcquireRenewRelease(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.LeaseTTL = time.Minute // expiry is tested separately
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	l := tf.f.Leases

	a, err := l.Acquire(ctx, "tile.k1", "worker-a")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if a.Token == 0 || a.Owner != "worker-a" || a.Key != "tile.k1" {
		t.Fatalf("lease = %+v", a)
	}
	if _, err := l.Acquire(ctx, "tile.k1", "worker-b"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("second Acquire = %v, want ErrLeaseHeld", err)
	}
	if _, err := l.Acquire(ctx, "tile.k1", "worker-a"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("re-Acquire by the holder = %v, want ErrLeaseHeld", err)
	}
	owner, tok, err := l.Owner(ctx, "tile.k1")
	if err != nil || owner != "worker-a" || tok != a.Token {
		t.Fatalf("Owner = %q, %d, %v; want worker-a at %d", owner, tok, err, a.Token)
	}
	if err := l.Check(ctx, a); err != nil {
		t.Fatalf("Check of a fresh lease: %v", err)
	}

	before := a.Token
	if err := l.Renew(ctx, a); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if a.Token <= before {
		t.Fatalf("Renew kept token %d (was %d), want a newer revision", a.Token, before)
	}
	// Another owner's stale view of the key renews, checks and releases nothing.
	other := &Lease{Key: "tile.k1", Owner: "worker-b", Token: before}
	if err := l.Renew(ctx, other); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Renew by another owner = %v, want ErrLeaseLost", err)
	}
	if err := l.Check(ctx, other); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Check by another owner = %v, want ErrLeaseLost", err)
	}
	// Releasing another's lease is a no-op, not an error, and leaves the real holder in place.
	if err := l.Release(ctx, other); err != nil {
		t.Fatalf("Release by another owner: %v", err)
	}
	if owner, _, _ := l.Owner(ctx, "tile.k1"); owner != "worker-a" {
		t.Fatalf("another owner's Release removed the live lease; owner now %q", owner)
	}

	if err := l.Release(ctx, a); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if owner, _, err := l.Owner(ctx, "tile.k1"); err != nil || owner != "" {
		t.Fatalf("Owner after Release = %q, %v; want free", owner, err)
	}
	if err := l.Check(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Check after Release = %v, want ErrLeaseLost", err)
	}
	// Create must succeed on a key whose latest revision is a delete marker.
	b, err := l.Acquire(ctx, "tile.k1", "worker-b")
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	if b.Token <= a.Token {
		t.Fatalf("fencing token went backwards: %d after %d", b.Token, a.Token)
	}
	if err := l.Renew(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("old holder Renew after takeover = %v, want ErrLeaseLost", err)
	}

	// And on a purged key.
	if err := l.kv.Purge(ctx, "tile.k1"); err != nil {
		t.Fatalf("Purge: %v", err)
	}
	c, err := l.Acquire(ctx, "tile.k1", "worker-c")
	if err != nil {
		t.Fatalf("Acquire after Purge: %v", err)
	}
	if err := l.Check(ctx, b); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Check of purged holder = %v, want ErrLeaseLost", err)
	}
	if err := l.Check(ctx, c); err != nil {
		t.Fatalf("Check of new holder: %v", err)
	}
	if _, err := l.Acquire(ctx, "bad key with spaces", "w"); err == nil || errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("Acquire of invalid key = %v, want a plain error", err)
	}
}

func TestAbandonedLeaseExpires(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.LeaseTTL = time.Second
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	l := tf.f.Leases

	a, err := l.Acquire(ctx, "tile.abandoned", "crashed-worker")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	acquired := time.Now()
	eventually(t, 3*cfg.LeaseTTL, "abandoned lease to expire", func() bool {
		owner, _, err := l.Owner(ctx, "tile.abandoned")
		if err != nil {
			t.Fatalf("Owner: %v", err)
		}
		return owner == ""
	})
	if since := time.Since(acquired); since < cfg.LeaseTTL/2 {
		t.Fatalf("lease vanished after %v, well before its TTL %v", since, cfg.LeaseTTL)
	}
	b, err := l.Acquire(ctx, "tile.abandoned", "rescuer")
	if err != nil {
		t.Fatalf("Acquire by another owner after expiry: %v", err)
	}
	if err := l.Renew(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("old holder Renew = %v, want ErrLeaseLost", err)
	}
	if err := l.Check(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("old holder Check = %v, want ErrLeaseLost", err)
	}
	if err := l.Release(ctx, a); err != nil {
		t.Fatalf("old holder Release: %v", err)
	}
	if owner, tok, _ := l.Owner(ctx, "tile.abandoned"); owner != "rescuer" || tok != b.Token {
		t.Fatalf("owner after old holder's release = %q@%d, want rescuer@%d", owner, tok, b.Token)
	}
}

func TestRenewedLeaseSurvives(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.LeaseTTL = time.Second
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	l := tf.f.Leases

	a, err := l.Acquire(ctx, "tile.alive", "worker-a")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	ticker := time.NewTicker(cfg.LeaseTTL / 3)
	defer ticker.Stop()
	end := time.Now().Add(3 * cfg.LeaseTTL)
	renewals := 0
	for time.Now().Before(end) {
		<-ticker.C
		if err := l.Renew(ctx, a); err != nil {
			t.Fatalf("Renew %d after %v: %v", renewals+1, time.Since(end.Add(-3*cfg.LeaseTTL)), err)
		}
		renewals++
		if _, err := l.Acquire(ctx, "tile.alive", "thief"); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("Acquire by another owner while renewed = %v, want ErrLeaseHeld", err)
		}
	}
	if err := l.Check(ctx, a); err != nil {
		t.Fatalf("Check after %d renewals over 3xTTL: %v", renewals, err)
	}
	if renewals < 7 {
		t.Fatalf("only %d renewals in 3xTTL", renewals)
	}
}

// A renewal the server applied but whose answer never reached the holder (it timed out on a busy
// server) leaves the holder's token one revision behind. The lease is still the holder's, so the
// next Renew, Check and Release adopt the current revision instead of abandoning a held tile; a
// lease another owner took over stays lost.
func TestLeaseAdoptsAnUnansweredRenewal(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.LeaseTTL = time.Minute
	tf := startFarm(t, cfg)
	ctx := testCtx(t)
	l := tf.f.Leases

	a, err := l.Acquire(ctx, "tile.k2", "worker-a/attempt-1")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// The renewal that was applied but not answered: the same compare-and-set Renew sends.
	applied, err := l.kv.Update(ctx, a.Key, []byte(a.Owner), a.Token)
	if err != nil {
		t.Fatalf("applying a renewal behind the holder's back: %v", err)
	}
	if err := l.Renew(ctx, a); err != nil {
		t.Fatalf("Renew after an unanswered renewal = %v, want the lease kept", err)
	}
	if a.Token <= applied {
		t.Fatalf("Renew left token %d, want past the unanswered renewal's %d", a.Token, applied)
	}
	if owner, tok, _ := l.Owner(ctx, a.Key); owner != a.Owner || tok != a.Token {
		t.Fatalf("key holds %q at %d, want %q at %d", owner, tok, a.Owner, a.Token)
	}

	applied, _ = l.kv.Update(ctx, a.Key, []byte(a.Owner), a.Token)
	if err := l.Check(ctx, a); err != nil || a.Token != applied {
		t.Fatalf("Check after an unanswered renewal = %v at token %d, want nil at %d", err, a.Token, applied)
	}

	if _, err := l.kv.Update(ctx, a.Key, []byte(a.Owner), a.Token); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, a); err != nil {
		t.Fatalf("Release after an unanswered renewal: %v", err)
	}
	if owner, _, _ := l.Owner(ctx, a.Key); owner != "" {
		t.Fatalf("Release after an unanswered renewal left the lease with %q", owner)
	}

	// Taken over in between: the old holder's next renewal is refused, whatever its token.
	if _, err := l.Acquire(ctx, "tile.k2", "worker-b/attempt-2"); err != nil {
		t.Fatalf("Acquire by the next holder: %v", err)
	}
	if err := l.Renew(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Renew by the previous holder = %v, want ErrLeaseLost", err)
	}
	if err := l.Check(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Check by the previous holder = %v, want ErrLeaseLost", err)
	}
}
