package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// checkpointBucket names the bucket holding one encoded Checkpoint per tile key.
const checkpointBucket = "checkpoints"

// DefaultCheckpointLockTimeout is how long OpenCheckpointStore waits for the
// file lock before reporting that another worker holds the store.
const DefaultLockTimeout = 2 * time.Second

// ErrCheckpointStoreLocked means another process (usually another worker
// pointed at the same checkpoint directory) holds the store's file lock.
var ErrLocked = errors.New("checkpoint store is locked by another process")

// ErrCheckpointStoreClosed is returned by operations on a closed store.
var ErrClosed = errors.New("checkpoint store is closed")

// CheckpointStore keeps a worker's tile checkpoints in a local bbolt file, so
// a restarted worker (or another one given the same directory later) resumes
// tiles from their last pass instead of sample 0. It is safe for concurrent
// use by the worker's render slots.
type Local struct {
	path  string
	db    *bolt.DB
	codec *Codec

	// mu guards closed; operations hold it shared so Close waits for them
	// before releasing the database and the codec.
	mu     sync.RWMutex
	closed bool
}

// OpenCheckpointStore opens (creating if needed, along with its directory)
// the checkpoint store at path. If another process holds the file lock for
// longer than DefaultCheckpointLockTimeout it fails with an error wrapping
// ErrCheckpointStoreLocked instead of hanging.
func OpenLocal(path string) (*Local, error) {
	return openLocal(path, DefaultLockTimeout)
}

func openLocal(path string, lockTimeout time.Duration) (*Local, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating checkpoint directory for %q: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("opening checkpoint store %q: %w (waited %s; is another worker using the same checkpoint directory?): %w",
			path, ErrLocked, lockTimeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("opening checkpoint store %q: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte(checkpointBucket))
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("creating checkpoint bucket in %q: %w", path, err)
	}
	codec, err := NewCodec()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("opening checkpoint store %q: %w", path, err)
	}
	return &Local{path: path, db: db, codec: codec}, nil
}

// Path returns the store's file path, for logs.
func (s *Local) Path() string { return s.path }

// acquire takes the shared lock for one operation and checks the context and
// that the store is open. The caller must call s.mu.RUnlock when it succeeds.
func (s *Local) acquire(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

// Save stores c under its tile key, replacing any earlier checkpoint of the
// same tile. It returns once the write is durable (bbolt syncs on commit).
func (s *Local) Save(ctx context.Context, c Checkpoint) error {
	if c.TileKey == "" {
		return errors.New("saving checkpoint: empty tile key")
	}
	enc, err := s.codec.Encode(c)
	if err != nil {
		return fmt.Errorf("saving checkpoint for tile %s: %w", c.TileKey, err)
	}
	return s.SaveEncoded(ctx, c.TileKey, enc)
}

// SaveEncoded stores a checkpoint of tileKey that a Codec already encoded (Codec.Encode), so a
// caller that also uploads it encodes it once. Like Save, it returns once the write is durable.
func (s *Local) SaveEncoded(ctx context.Context, tileKey string, enc []byte) error {
	if tileKey == "" {
		return errors.New("saving checkpoint: empty tile key")
	}
	if err := s.acquire(ctx); err != nil {
		return fmt.Errorf("saving checkpoint for tile %s: %w", tileKey, err)
	}
	defer s.mu.RUnlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(checkpointBucket)).Put([]byte(tileKey), enc)
	})
	if err != nil {
		return fmt.Errorf("saving checkpoint for tile %s: %w", tileKey, err)
	}
	return nil
}

// Load returns the checkpoint stored for tileKey and whether there was one.
// A stored checkpoint that is corrupt, or that names a different tile, is
// logged, deleted and reported as absent: the tile then simply restarts from
// sample 0. Whether its input hash still matches is for the caller to check
// with Checkpoint.Matches.
func (s *Local) Load(ctx context.Context, tileKey string) (Checkpoint, bool, error) {
	if err := s.acquire(ctx); err != nil {
		return Checkpoint{}, false, fmt.Errorf("loading checkpoint for tile %s: %w", tileKey, err)
	}
	defer s.mu.RUnlock()

	var (
		ck       Checkpoint
		found    bool
		bad      []byte // copy of a corrupt value, to delete it below
		badCause error
	)
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket([]byte(checkpointBucket)).Get([]byte(tileKey))
		if v == nil {
			return nil
		}
		dec, err := s.codec.Decode(v)
		if err == nil && dec.TileKey != tileKey {
			err = fmt.Errorf("%w: stored under tile %s but names tile %s", ErrCorrupt, tileKey, dec.TileKey)
		}
		if err != nil {
			bad, badCause = bytes.Clone(v), err
			return nil
		}
		ck, found = dec, true
		return nil
	})
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("loading checkpoint for tile %s: %w", tileKey, err)
	}
	if bad == nil {
		return ck, found, nil
	}

	// Delete the corrupt value, unless a concurrent Save replaced it with a
	// good checkpoint in the meantime.
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(checkpointBucket))
		if cur := b.Get([]byte(tileKey)); cur != nil && bytes.Equal(cur, bad) {
			return b.Delete([]byte(tileKey))
		}
		return nil
	})
	if err != nil {
		slog.Warn("discarding corrupt checkpoint; deleting it failed",
			"tile_key", tileKey, "path", s.path, "cause", badCause, "error", err)
	} else {
		slog.Warn("discarded corrupt checkpoint",
			"tile_key", tileKey, "path", s.path, "bytes", len(bad), "error", badCause)
	}
	return Checkpoint{}, false, nil
}

// Delete removes the checkpoint of tileKey; deleting an absent one is not an
// error, so a retried finalize can call it again safely.
func (s *Local) Delete(ctx context.Context, tileKey string) error {
	if err := s.acquire(ctx); err != nil {
		return fmt.Errorf("deleting checkpoint for tile %s: %w", tileKey, err)
	}
	defer s.mu.RUnlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(checkpointBucket)).Delete([]byte(tileKey))
	})
	if err != nil {
		return fmt.Errorf("deleting checkpoint for tile %s: %w", tileKey, err)
	}
	return nil
}

// List returns the tile keys that have a stored checkpoint, in byte order,
// e.g. for a worker to report or clean up leftovers at startup.
func (s *Local) List(ctx context.Context) ([]string, error) {
	if err := s.acquire(ctx); err != nil {
		return nil, fmt.Errorf("listing checkpoints: %w", err)
	}
	defer s.mu.RUnlock()
	var keys []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(checkpointBucket)).ForEach(func(k, _ []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints: %w", err)
	}
	return keys, nil
}

// Close waits for running operations, then closes the database (releasing
// its file lock for the next worker) and the codec. Closing twice is a no-op.
func (s *Local) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	dbErr := s.db.Close()
	codecErr := s.codec.Close()
	if err := errors.Join(dbErr, codecErr); err != nil {
		return fmt.Errorf("closing checkpoint store %q: %w", s.path, err)
	}
	return nil
}
