package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrLeaseHeld means another owner holds a live lease on the key: the caller should back off (NakWithDelay).
var ErrLeaseHeld = errors.New("lease held by another owner")

// ErrLeaseLost means the caller's lease expired or was taken over: it must stop at once, without finalizing
// or acking, because another worker may already own the tile.
var ErrLeaseLost = errors.New("lease lost")

// Lease is a held lease. Owner names the holder and must be unique to one acquisition (a worker's
// name and its attempt id), since the KV value is what says whose lease it is. Token is the KV
// revision of the holder's last write: it is the handle of the compare-and-set that renews and
// releases the lease, and it changes on every renewal. A Lease is not safe for concurrent use:
// serialize Renew, Check and Release.
type Lease struct {
	Key   string
	Owner string
	Token uint64
}

// Leases hands out fencing-token leases from the "leases" KV bucket. The bucket TTL expires a lease whose
// holder stopped renewing it, so a crashed worker's tile becomes available again without any reaper.
type Leases struct {
	kv  jetstream.KeyValue
	ttl time.Duration
}

// TTL returns the bucket TTL; holders must renew well within it (workers renew every TTL/5 or so).
func (l *Leases) TTL() time.Duration { return l.ttl }

// Acquire creates the lease for key. A live lease of anyone, the same owner included, yields ErrLeaseHeld;
// a deleted, purged or expired one is taken over.
func (l *Leases) Acquire(ctx context.Context, key, owner string) (*Lease, error) {
	if owner == "" {
		return nil, fmt.Errorf("acquiring lease %q: empty owner", key)
	}
	rev, err := l.kv.Create(ctx, key, []byte(owner))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("acquiring lease %q for %q: %w", key, owner, ErrLeaseHeld)
		}
		return nil, fmt.Errorf("acquiring lease %q for %q: %w", key, owner, err)
	}
	return &Lease{Key: key, Owner: owner, Token: rev}, nil
}

// Renew extends the lease by a compare-and-set on its token and stores the new token in lease. A
// mismatch whose current value is still lease.Owner is a renewal of ours that the server applied
// but whose answer never arrived (it timed out on a busy server): Renew adopts that revision and
// renews from it, so a slow answer does not cost the holder its tile. Any other mismatch,
// including an expired key, is ErrLeaseLost.
func (l *Leases) Renew(ctx context.Context, lease *Lease) error {
	rev, err := l.kv.Update(ctx, lease.Key, []byte(lease.Owner), lease.Token)
	if isRevisionMismatch(err) {
		if aerr := l.adopt(ctx, lease); aerr != nil {
			return fmt.Errorf("renewing lease: %w", aerr)
		}
		rev, err = l.kv.Update(ctx, lease.Key, []byte(lease.Owner), lease.Token)
	}
	if err != nil {
		if isRevisionMismatch(err) {
			return fmt.Errorf("renewing lease %q of %q at token %d: %w", lease.Key, lease.Owner, lease.Token, ErrLeaseLost)
		}
		return fmt.Errorf("renewing lease %q of %q: %w", lease.Key, lease.Owner, err)
	}
	lease.Token = rev
	return nil
}

// isRevisionMismatch reports whether a KV write failed its compare-and-set (or found no key).
func isRevisionMismatch(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) ||
		errors.Is(err, jetstream.ErrKeyNotFound)
}

// adopt moves lease.Token to the key's current revision when the key still holds lease.Owner,
// a write of this holder the caller did not hear about; otherwise the lease is lost.
func (l *Leases) adopt(ctx context.Context, lease *Lease) error {
	owner, token, err := l.Owner(ctx, lease.Key)
	if err != nil {
		return err
	}
	if owner != lease.Owner {
		return fmt.Errorf("lease %q of %q at token %d now held by %q at %d: %w", lease.Key, lease.Owner, lease.Token, owner, token, ErrLeaseLost)
	}
	lease.Token = token
	return nil
}

// Release deletes the lease if the key still holds lease.Owner (adopting a renewal it did not hear
// about, as Renew does). A lease that already changed hands is left alone and is not an error: the
// caller no longer owned anything to release.
func (l *Leases) Release(ctx context.Context, lease *Lease) error {
	err := l.kv.Delete(ctx, lease.Key, jetstream.LastRevision(lease.Token))
	if isRevisionMismatch(err) {
		if aerr := l.adopt(ctx, lease); errors.Is(aerr, ErrLeaseLost) {
			return nil
		} else if aerr != nil {
			return fmt.Errorf("releasing lease: %w", aerr)
		}
		err = l.kv.Delete(ctx, lease.Key, jetstream.LastRevision(lease.Token))
		if isRevisionMismatch(err) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("releasing lease %q of %q: %w", lease.Key, lease.Owner, err)
	}
	return nil
}

// Owner returns the current holder of key and its token; owner is "" (and err nil) when nobody holds it.
func (l *Leases) Owner(ctx context.Context, key string) (owner string, token uint64, err error) {
	e, err := l.kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return "", 0, nil
		}
		return "", 0, fmt.Errorf("reading lease %q: %w", key, err)
	}
	return string(e.Value()), e.Revision(), nil
}

// Check is the fencing test done right before an irreversible step: it returns ErrLeaseLost
// unless the key still holds lease.Owner, and adopts the current revision as Renew does. On a
// replicated bucket the read may be served by a lagging replica, so Check narrows the window but
// the final guard stays the manifest's create-if-absent.
func (l *Leases) Check(ctx context.Context, lease *Lease) error {
	if err := l.adopt(ctx, lease); err != nil {
		return fmt.Errorf("checking lease: %w", err)
	}
	return nil
}
