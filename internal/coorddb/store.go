package coorddb

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"slices"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketJobs     = []byte("jobs")
	bucketIdem     = []byte("idempotency")
	bucketFrames   = []byte("frames")
	bucketTiles    = []byte("tiles")    // frame_key -> TileTable
	bucketObjects  = []byte("objects")  // frame_key -> TileObjects
	bucketTimes    = []byte("times")    // frame_key -> TileTimes
	bucketFailures = []byte("failures") // frame_key/tile index -> []Failure
	bucketOpen     = []byte("open")     // frame_key of every frame not completed
	bucketOutbox   = []byte("outbox")
	bucketDeps     = []byte("dependents") // upstream job_id/downstream job_id -> nothing
	bucketResumes  = []byte("resumes")    // frame_key/attempt_id -> samples recovered (uvarint): a resume counted
	bucketTerm     = []byte("term")       // "term" -> the farm's leadership term (Term)
	allBuckets     = [][]byte{bucketJobs, bucketIdem, bucketFrames, bucketTiles, bucketObjects, bucketTimes, bucketFailures, bucketOpen, bucketOutbox,
		bucketNotify, bucketAnnounced, bucketDeps, bucketResumes, bucketTerm}
)

// ErrNotFound is returned when a job or frame does not exist.
var ErrNotFound = errors.New("not found")

// Store is the coordinator's bbolt database.
type DB struct {
	db      *bolt.DB
	path    string
	journal Journal // where Update writes its changes before committing (SetJournal)
}

// Open opens (creating if needed) the coordinator database at path. A second coordinator on the
// same file fails after a short wait instead of blocking forever.
func Open(path string) (*DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("opening coordinator database %q: locked by another coordinator", path)
		}
		return nil, fmt.Errorf("opening coordinator database %q: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range append([][]byte{bucketMeta}, allBuckets...) {
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
	return &DB{db: db, path: path}, nil
}

// Close closes the database.
func (s *DB) Close() error { return s.db.Close() }

// Size is the database file's size in bytes.
func (s *DB) Size() (int64, error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Update runs fn in one read-write transaction; everything fn writes commits together or not
// at all. With a journal (SetJournal), what fn wrote is appended to it before the commit, and
// a journal's refusal rolls it all back.
func (s *DB) Update(ctx context.Context, fn func(tx *Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(btx *bolt.Tx) error {
		tx := &Tx{tx: btx}
		if s.journal != nil {
			tx.rec = new(changeWriter)
		}
		if err := fn(tx); err != nil {
			return err
		}
		if tx.rec == nil || tx.rec.buf.Len() == 0 {
			return nil
		}
		seq, err := s.journal.Append(ctx, applied(btx), tx.rec.buf.Bytes())
		if err != nil {
			return err
		}
		return setApplied(btx, seq)
	})
}

// View runs fn in a read-only transaction.
func (s *DB) View(ctx context.Context, fn func(tx *Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// Tx gives typed access to the buckets inside one transaction.
type Tx struct {
	tx  *bolt.Tx
	rec *changeWriter // what the transaction wrote, for the journal; nil without one
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
	return tx.set(bucket, []byte(key), raw)
}

// Job returns a job by id.
func (tx *Tx) Job(id string) (*Job, error) { return get[Job](tx, bucketJobs, id) }

// fingerprintSeed seeds Fingerprint's hash; a fingerprint is only ever compared within one
// process.
var fingerprintSeed = maphash.MakeSeed()

// Fingerprint hashes the stored bytes of job j and of each of its frames, without decoding
// them: equal fingerprints mean a status computed from these records would come out the same
// (a cache's key; a status that also reads tile tables or failures must not be cached by it).
// A frame not stored hashes as absent. It is the sum of JobFingerprint and of each frame's
// FrameFingerprint, so it can be summed frame by frame in any order: EachFrame fingerprints
// every job at once in one pass over the frames.
func (tx *Tx) Fingerprint(j *Job) uint64 {
	keys := make([]string, 0, j.Frames())
	for n := range j.FrameNumbers() {
		keys = append(keys, j.FrameKey(n))
	}
	return tx.FingerprintFrames(j.ID, keys)
}

// FingerprintFrames is Fingerprint of the job jobID whose frames have the keys frameKeys
// (Job.FrameKey of each of its frames): a caller that keeps a job's frame keys saves deriving
// them, a hash each, every time.
func (tx *Tx) FingerprintFrames(jobID string, frameKeys []string) uint64 {
	fp := tx.JobFingerprint(jobID)
	frames := tx.tx.Bucket(bucketFrames)
	for _, k := range frameKeys {
		fp += FrameFingerprint([]byte(k), frames.Get([]byte(k)))
	}
	return fp
}

// JobFingerprint is the job record's part of Fingerprint.
func (tx *Tx) JobFingerprint(jobID string) uint64 {
	return recordHash([]byte(jobID), tx.tx.Bucket(bucketJobs).Get([]byte(jobID)))
}

// FrameFingerprint is a frame's part of Fingerprint: of its key and its stored record (raw),
// nil when it is not stored.
func FrameFingerprint(key, raw []byte) uint64 { return recordHash(key, raw) }

// recordHash hashes a record's key and bytes, absent (nil) apart from empty.
func recordHash(key, raw []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(key)))
	h.Write(n[:])
	h.Write(key)
	size := uint64(len(raw))
	if raw == nil {
		size = ^uint64(0)
	}
	binary.LittleEndian.PutUint64(n[:], size)
	h.Write(n[:])
	h.Write(raw)
	return h.Sum64()
}

// EachFrame calls fn with the key and stored record of every frame, in key order: one pass
// over the frames, far cheaper than a lookup per frame when every job's frames are wanted.
// key and raw are valid only during fn.
func (tx *Tx) EachFrame(fn func(key, raw []byte)) {
	c := tx.tx.Bucket(bucketFrames).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		fn(k, v)
	}
}

// PutJob writes a job and indexes its idempotency key.
func (tx *Tx) PutJob(j *Job) error {
	if err := tx.set(bucketIdem, []byte(j.IdempotencyKey), []byte(j.ID)); err != nil {
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

// AddDependent records that job down waits for job up (Job.After, Job.AfterFrames), so a
// change of up finds the jobs it may release without reading every job.
func (tx *Tx) AddDependent(up, down string) error {
	return tx.set(bucketDeps, []byte(up+"/"+down), nil)
}

// Dependents returns the ids of the jobs that wait for job up, in id order.
func (tx *Tx) Dependents(up string) []string {
	var out []string
	prefix := []byte(up + "/")
	c := tx.tx.Bucket(bucketDeps).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		out = append(out, string(k[len(prefix):]))
	}
	return out
}

// Frame returns a frame by frame_key.
func (tx *Tx) Frame(key string) (*Frame, error) { return get[Frame](tx, bucketFrames, key) }

// PutFrame writes a frame and keeps the index of unfinished frames in step with its state.
func (tx *Tx) PutFrame(f *Frame) error {
	var err error
	if f.State == FrameCompleted {
		err = tx.del(bucketOpen, []byte(f.Key))
	} else {
		err = tx.set(bucketOpen, []byte(f.Key), nil)
	}
	if err != nil {
		return err
	}
	return put(tx, bucketFrames, f.Key, f)
}

// OpenFrames calls fn with the key of every frame that is not completed, in key order, until
// fn returns false. Its cost grows with unfinished frames, never with finished ones.
func (tx *Tx) OpenFrames(fn func(frameKey string) bool) {
	c := tx.tx.Bucket(bucketOpen).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if !fn(string(k)) {
			return
		}
	}
}

// TileTable returns the tile table of frame f; a frame no tile event has touched yet has none
// stored and gets an all-queued one. The returned table is the caller's to modify.
func (tx *Tx) TileTable(f *Frame) (TileTable, error) {
	raw := tx.tx.Bucket(bucketTiles).Get([]byte(f.Key))
	if raw == nil {
		return NewTileTable(f.TilesTotal), nil
	}
	t := TileTable(bytes.Clone(raw))
	if err := t.check(f.TilesTotal); err != nil {
		return nil, fmt.Errorf("frame %s: %w", f.Key, err)
	}
	return t, nil
}

// PutTileTable stores the tile table of a frame.
func (tx *Tx) PutTileTable(frameKey string, t TileTable) error {
	return tx.set(bucketTiles, []byte(frameKey), t)
}

func failureKey(frameKey string, tile int) []byte {
	k := make([]byte, len(frameKey)+1+4)
	copy(k, frameKey)
	k[len(frameKey)] = '/'
	binary.BigEndian.PutUint32(k[len(frameKey)+1:], uint32(tile))
	return k
}

// MaxAttemptID bounds the attempt ids the resumes bucket keeps: an attempt id is a worker's
// (identity.NewAttemptID), and a longer one comes from no worker.
const MaxAttemptID = 64

// AddResume records that attempt of a tile of frame frameKey resumed samples from a checkpoint, and
// reports whether it was news: each attempt's recovered samples are counted once, whatever
// order its start arrives in and however often (docs/design.md, "States"). Only attempts that
// recovered samples are kept (a few bytes each), so a frame rendered without a kill costs
// nothing here.
func (tx *Tx) AddResume(frameKey, attempt string, samples int) (bool, error) {
	if attempt == "" || len(attempt) > MaxAttemptID {
		return false, fmt.Errorf("attempt id of %d bytes: want 1 to %d", len(attempt), MaxAttemptID)
	}
	b := tx.tx.Bucket(bucketResumes)
	k := []byte(frameKey + "/" + attempt)
	if b.Get(k) != nil {
		return false, nil
	}
	return true, tx.set(bucketResumes, k, binary.AppendUvarint(nil, uint64(max(samples, 0))))
}

// AddFailure records a failed attempt of tile index tile of a frame, keeping the newest few.
func (tx *Tx) AddFailure(frameKey string, tile int, f Failure) error {
	if len(f.Error) > maxFailureText {
		f.Error = f.Error[:maxFailureText] + "..."
	}
	f.Log = boundLog(f.Log)
	b := tx.tx.Bucket(bucketFailures)
	k := failureKey(frameKey, tile)
	var list []Failure
	if raw := b.Get(k); raw != nil {
		if err := json.Unmarshal(raw, &list); err != nil {
			return fmt.Errorf("decoding failures of frame %s tile %d: %w", frameKey, tile, err)
		}
	}
	list = append(list, f)
	if n := len(list) - maxFailuresPerTile; n > 0 {
		list = list[n:]
	}
	raw, err := json.Marshal(list)
	if err != nil {
		return err
	}
	return tx.set(bucketFailures, k, raw)
}

// boundLog keeps the newest lines of a failed attempt's log within maxFailureLogLines and
// maxFailureLogBytes: the worker bounds what it sends, and the store bounds what it keeps.
func boundLog(lines []string) []string {
	lines = lines[max(0, len(lines)-maxFailureLogLines):]
	size, first := 0, len(lines)
	for first > 0 && size+len(lines[first-1]) <= maxFailureLogBytes {
		first--
		size += len(lines[first])
	}
	if first == len(lines) && first > 0 { // one line alone is longer than the bound: its end
		last := lines[first-1]
		return []string{"..." + last[len(last)-maxFailureLogBytes+3:]}
	}
	if first == len(lines) {
		return nil
	}
	return slices.Clone(lines[first:])
}

// TileFailures returns the recorded failures of one tile of a frame, oldest first.
func (tx *Tx) TileFailures(frameKey string, tile int) ([]Failure, error) {
	raw := tx.tx.Bucket(bucketFailures).Get(failureKey(frameKey, tile))
	if raw == nil {
		return nil, nil
	}
	var list []Failure
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("decoding failures of frame %s tile %d: %w", frameKey, tile, err)
	}
	return list, nil
}

// Failures returns the recorded failures of every failed tile of a frame, by tile index.
func (tx *Tx) Failures(frameKey string) (map[int][]Failure, error) {
	out := map[int][]Failure{}
	prefix := []byte(frameKey + "/")
	c := tx.tx.Bucket(bucketFailures).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if len(k) != len(prefix)+4 {
			continue
		}
		var list []Failure
		if err := json.Unmarshal(v, &list); err != nil {
			return nil, fmt.Errorf("decoding failures of frame %s: %w", frameKey, err)
		}
		out[int(binary.BigEndian.Uint32(k[len(prefix):]))] = list
	}
	return out, nil
}

// EachFailure calls fn with the recorded failures of every tile that has any, by frame key
// and tile index, until fn returns an error.
func (tx *Tx) EachFailure(fn func(frameKey string, tile int, list []Failure) error) error {
	return tx.tx.Bucket(bucketFailures).ForEach(func(k, v []byte) error {
		if len(k) < 5 || k[len(k)-5] != '/' {
			return nil
		}
		var list []Failure
		if err := json.Unmarshal(v, &list); err != nil {
			return fmt.Errorf("decoding failures %q: %w", k, err)
		}
		return fn(string(k[:len(k)-5]), int(binary.BigEndian.Uint32(k[len(k)-4:])), list)
	})
}

// AddOutbox appends a record for the relay to publish.
func (tx *Tx) AddOutbox(r OutboxRecord) error {
	seq, err := tx.nextSeq(bucketOutbox)
	if err != nil {
		return err
	}
	return put(tx, bucketOutbox, seqKey(seq), r)
}

func seqKey(seq uint64) string {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return string(k[:])
}

// PendingOutbox returns up to limit outbox records in the order they were written.
func (s *DB) PendingOutbox(ctx context.Context, limit int) ([]OutboxRecord, error) {
	var recs []OutboxRecord
	err := s.View(ctx, func(tx *Tx) error {
		c := tx.tx.Bucket(bucketOutbox).Cursor()
		for k, v := c.First(); k != nil && len(recs) < limit; k, v = c.Next() {
			var r OutboxRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decoding outbox record: %w", err)
			}
			r.Seq = binary.BigEndian.Uint64(k)
			recs = append(recs, r)
		}
		return nil
	})
	return recs, err
}

// MarkOutboxTried sets Tried on the records with these seqs (those deleted meanwhile are
// skipped) in one transaction.
func (s *DB) MarkOutboxTried(ctx context.Context, seqs ...uint64) error {
	return s.Update(ctx, func(tx *Tx) error {
		b := tx.tx.Bucket(bucketOutbox)
		for _, seq := range seqs {
			v := b.Get([]byte(seqKey(seq)))
			if v == nil {
				continue
			}
			var r OutboxRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decoding outbox record %d: %w", seq, err)
			}
			r.Tried = true
			if err := put(tx, bucketOutbox, seqKey(seq), r); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteOutbox removes published records in one transaction.
func (s *DB) DeleteOutbox(ctx context.Context, seqs ...uint64) error {
	return s.Update(ctx, func(tx *Tx) error {
		for _, seq := range seqs {
			if err := tx.del(bucketOutbox, []byte(seqKey(seq))); err != nil {
				return err
			}
		}
		return nil
	})
}

// OutboxLen counts records not yet published.
func (s *DB) OutboxLen(ctx context.Context) (int, error) {
	n := 0
	err := s.View(ctx, func(tx *Tx) error {
		n = tx.tx.Bucket(bucketOutbox).Stats().KeyN
		return nil
	})
	return n, err
}

// Counts reports how many records each bucket holds, for tests and benchmarks that check a
// submission's shape.
func (s *DB) Counts(ctx context.Context) (map[string]int, error) {
	out := map[string]int{}
	err := s.View(ctx, func(tx *Tx) error {
		for _, b := range allBuckets {
			out[string(b)] = tx.tx.Bucket(b).Stats().KeyN
		}
		return nil
	})
	return out, err
}
