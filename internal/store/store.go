package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketJobs   = []byte("jobs")
	bucketIdem   = []byte("idempotency")
	bucketFrames = []byte("frames")
	bucketTiles  = []byte("tiles")
	bucketOutbox = []byte("outbox")
	bucketEvents = []byte("events")
	allBuckets   = [][]byte{bucketJobs, bucketIdem, bucketFrames, bucketTiles, bucketOutbox, bucketEvents}
)

// ErrNotFound is returned when a job, frame or tile does not exist.
var ErrNotFound = errors.New("not found")

// Store is the coordinator's bbolt database.
type Store struct {
	db *bolt.DB
}

// Open opens (creating if needed) the coordinator database at path. A second coordinator on the
// same file fails after a short wait instead of blocking forever.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("opening coordinator database %q: locked by another coordinator", path)
		}
		return nil, fmt.Errorf("opening coordinator database %q: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialising coordinator database %q: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Update runs fn in one read-write transaction; everything fn writes commits together or not at all.
func (s *Store) Update(ctx context.Context, fn func(tx *Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// View runs fn in a read-only transaction.
func (s *Store) View(ctx context.Context, fn func(tx *Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// Tx gives typed access to the buckets inside one transaction.
type Tx struct {
	tx *bolt.Tx
}

func get[T any](tx *Tx, bucket []byte, key string) (*T, error) {
	raw := tx.tx.Bucket(bucket).Get([]byte(key))
	if raw == nil {
		return nil, fmt.Errorf("%s %q: %w", bucket, key, ErrNotFound)
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("decoding %s %q: %w", bucket, key, err)
	}
	return v, nil
}

func put(tx *Tx, bucket []byte, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s %q: %w", bucket, key, err)
	}
	return tx.tx.Bucket(bucket).Put([]byte(key), raw)
}

// Job returns a job by id.
func (tx *Tx) Job(id string) (*Job, error) { return get[Job](tx, bucketJobs, id) }

// PutJob writes a job and indexes its idempotency key.
func (tx *Tx) PutJob(j *Job) error {
	if err := tx.tx.Bucket(bucketIdem).Put([]byte(j.IdempotencyKey), []byte(j.ID)); err != nil {
		return err
	}
	return put(tx, bucketJobs, j.ID, j)
}

// JobByIdempotencyKey returns the job that holds key, or ErrNotFound.
func (tx *Tx) JobByIdempotencyKey(key string) (*Job, error) {
	id := tx.tx.Bucket(bucketIdem).Get([]byte(key))
	if id == nil {
		return nil, fmt.Errorf("idempotency key: %w", ErrNotFound)
	}
	return tx.Job(string(id))
}

// Jobs lists every job, oldest first.
func (tx *Tx) Jobs() ([]*Job, error) {
	var jobs []*Job
	err := tx.tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
		j := new(Job)
		if err := json.Unmarshal(v, j); err != nil {
			return fmt.Errorf("decoding job %q: %w", k, err)
		}
		jobs = append(jobs, j)
		return nil
	})
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Created.Before(jobs[b].Created) })
	return jobs, err
}

// Frame returns a frame by frame_key.
func (tx *Tx) Frame(key string) (*Frame, error) { return get[Frame](tx, bucketFrames, key) }

// PutFrame writes a frame.
func (tx *Tx) PutFrame(f *Frame) error { return put(tx, bucketFrames, f.Key, f) }

// Tile returns a tile by tile_key.
func (tx *Tx) Tile(key string) (*Tile, error) { return get[Tile](tx, bucketTiles, key) }

// PutTile writes a tile.
func (tx *Tx) PutTile(t *Tile) error { return put(tx, bucketTiles, t.Key, t) }

// AddOutbox appends a record for the relay to publish.
func (tx *Tx) AddOutbox(subject, msgID string, data []byte) error {
	b := tx.tx.Bucket(bucketOutbox)
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	return put(tx, bucketOutbox, seqKey(seq), OutboxRecord{Seq: seq, Subject: subject, MsgID: msgID, Data: data})
}

// SeenEvent reports whether an event id was applied before, and marks it applied.
func (tx *Tx) SeenEvent(id string, now time.Time) (bool, error) {
	b := tx.tx.Bucket(bucketEvents)
	if b.Get([]byte(id)) != nil {
		return true, nil
	}
	var stamp [8]byte
	binary.BigEndian.PutUint64(stamp[:], uint64(now.Unix()))
	return false, b.Put([]byte(id), stamp[:])
}

// PruneEvents forgets applied event ids recorded before cutoff. Call it with a cutoff older than
// the EVENTS stream's retention: an event that can no longer be redelivered needs no marker.
func (s *Store) PruneEvents(ctx context.Context, cutoff time.Time) (int, error) {
	n := 0
	err := s.Update(ctx, func(tx *Tx) error {
		c := tx.tx.Bucket(bucketEvents).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(v) != 8 || int64(binary.BigEndian.Uint64(v)) < cutoff.Unix() {
				if err := c.Delete(); err != nil {
					return err
				}
				n++
			}
		}
		return nil
	})
	return n, err
}

func seqKey(seq uint64) string {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return string(k[:])
}

// PendingOutbox returns up to limit outbox records in the order they were written.
func (s *Store) PendingOutbox(ctx context.Context, limit int) ([]OutboxRecord, error) {
	var recs []OutboxRecord
	err := s.View(ctx, func(tx *Tx) error {
		c := tx.tx.Bucket(bucketOutbox).Cursor()
		for k, v := c.First(); k != nil && len(recs) < limit; k, v = c.Next() {
			var r OutboxRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decoding outbox record: %w", err)
			}
			recs = append(recs, r)
		}
		return nil
	})
	return recs, err
}

// DeleteOutbox removes a published record.
func (s *Store) DeleteOutbox(ctx context.Context, seq uint64) error {
	return s.Update(ctx, func(tx *Tx) error {
		return tx.tx.Bucket(bucketOutbox).Delete([]byte(seqKey(seq)))
	})
}

// OutboxLen counts records not yet published.
func (s *Store) OutboxLen(ctx context.Context) (int, error) {
	n := 0
	err := s.View(ctx, func(tx *Tx) error {
		n = tx.tx.Bucket(bucketOutbox).Stats().KeyN
		return nil
	})
	return n, err
}
