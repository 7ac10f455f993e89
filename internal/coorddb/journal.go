package coorddb

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Journal is where every committed change of a database goes first: the farm's replicated log
// of the coordinators' projection (docs/design.md, "Replication"). Update hands it each
// transaction's changes before committing, so a change is on the log before anyone hears of
// it, and a coordinator that follows the log (Apply) holds the same bytes as the one that
// wrote it.
type Journal interface {
	// Append stores changes as the entries right after sequence after (the log's last entry
	// this database has), and returns the sequence of the last entry it wrote. An error rolls
	// the transaction back; it must then be assumed that the entries may have been stored
	// anyway, and the database caught up from the log before it writes again.
	Append(ctx context.Context, after uint64, changes []byte) (uint64, error)
}

// ErrBadJournal is a journal entry that does not decode: written by something else, or cut.
var ErrBadJournal = errors.New("journal entry does not decode")

// bucketMeta holds what is this database's own and never journaled: the sequence of the last
// journal entry it holds.
var (
	bucketMeta = []byte("meta")
	keyApplied = []byte("journal-applied")
)

// The operations of a journaled change set, each a byte followed by its arguments.
const (
	opPut   = 'p' // bucket, key, value
	opDel   = 'd' // bucket, key
	opSeq   = 's' // bucket, sequence: a bucket's NextSequence
	opReset = 'r' // nothing: every journaled bucket emptied, as a snapshot's first change
)

// SetJournal makes every later Update write its changes to j before committing; nil stops it.
// Set it before the database is shared.
func (s *DB) SetJournal(j Journal) { s.journal = j }

// Applied is the sequence of the last journal entry the database holds: 0 for none.
func (s *DB) Applied(ctx context.Context) (uint64, error) {
	var seq uint64
	err := s.View(ctx, func(tx *Tx) error {
		seq = applied(tx.tx)
		return nil
	})
	return seq, err
}

func applied(btx *bolt.Tx) uint64 {
	if v := btx.Bucket(bucketMeta).Get(keyApplied); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func setApplied(btx *bolt.Tx, seq uint64) error {
	return btx.Bucket(bucketMeta).Put(keyApplied, binary.BigEndian.AppendUint64(nil, seq))
}

// Apply writes one journal entry's changes, as another database's Update wrote them, and
// records seq as the last entry held, all in one transaction. It does not journal them again:
// it is how a coordinator that does not lead follows the one that does.
func (s *DB) Apply(ctx context.Context, seq uint64, changes []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(btx *bolt.Tx) error {
		if err := applyChanges(btx, changes); err != nil {
			return fmt.Errorf("applying journal entry %d: %w", seq, err)
		}
		return setApplied(btx, seq)
	})
}

// Snapshot is every journaled record of the database as one change set whose first change
// empties every bucket: applied, it makes a database equal to this one.
func (s *DB) Snapshot(ctx context.Context) (snap []byte, empty bool, err error) {
	err = s.View(ctx, func(tx *Tx) error {
		snap, empty, err = snapshot(tx.tx)
		return err
	})
	return snap, empty, err
}

// WriteSnapshot appends the whole database to its journal as one entry, in a transaction of
// its own, so no other write comes between what it read and where it is appended, and
// returns the entry's sequence: a leader compacts the journal so (the entries before it can
// go), and gives a journal that lacks what its database holds its records (an upgrade, a log
// lost). The entry goes after the last the database holds, or after skipTo if that is later:
// the journal's entries up to skipTo are given up (a gap the database cannot catch up over).
// A database holding nothing writes nothing and returns 0.
func (s *DB) WriteSnapshot(ctx context.Context, skipTo uint64) (seq uint64, err error) {
	if s.journal == nil {
		return 0, errors.New("writing a snapshot: the database has no journal")
	}
	err = s.db.Update(func(btx *bolt.Tx) error {
		snap, empty, err := snapshot(btx)
		if err != nil || empty {
			return err
		}
		if seq, err = s.journal.Append(ctx, max(applied(btx), skipTo), snap); err != nil {
			return err
		}
		return setApplied(btx, seq)
	})
	return seq, err
}

func snapshot(btx *bolt.Tx) ([]byte, bool, error) {
	var w changeWriter
	w.op(opReset)
	empty := true
	for _, name := range allBuckets {
		b := btx.Bucket(name)
		if err := b.ForEach(func(k, v []byte) error {
			empty = false
			w.put(name, k, v)
			return nil
		}); err != nil {
			return nil, false, err
		}
		if seq := b.Sequence(); seq > 0 {
			w.seq(name, seq)
		}
	}
	return w.buf.Bytes(), empty, nil
}

// IsSnapshot reports whether a change set is a snapshot (Snapshot): applied, it replaces
// everything, so a database may apply it whatever it held before.
func IsSnapshot(changes []byte) bool { return len(changes) > 0 && changes[0] == opReset }

// Term is a term of the farm's leadership as its leader recorded it, the first entry it
// journals: every coordinator that led before is behind the journal from then on.
type Term struct {
	Leader  string    `json:"leader"`
	Address string    `json:"address,omitempty"`
	Token   uint64    `json:"token"` // the leadership lease's revision
	Began   time.Time `json:"began"`
}

var keyTerm = []byte("term")

// PutTerm records the term of leadership beginning.
func (tx *Tx) PutTerm(t Term) error { return put(tx, bucketTerm, string(keyTerm), t) }

// Term is the last term recorded; ok is false before any.
func (tx *Tx) Term() (t Term, ok bool, err error) {
	v, err := get[Term](tx, bucketTerm, string(keyTerm))
	if errors.Is(err, ErrNotFound) {
		return t, false, nil
	}
	if err != nil {
		return t, false, err
	}
	return *v, true, nil
}

// changeWriter encodes a change set.
type changeWriter struct{ buf bytes.Buffer }

func (w *changeWriter) op(op byte) { w.buf.WriteByte(op) }

func (w *changeWriter) bytes(b []byte) {
	w.buf.Write(binary.AppendUvarint(nil, uint64(len(b))))
	w.buf.Write(b)
}

func (w *changeWriter) put(bucket, key, val []byte) {
	w.op(opPut)
	w.bytes(bucket)
	w.bytes(key)
	w.bytes(val)
}

func (w *changeWriter) del(bucket, key []byte) {
	w.op(opDel)
	w.bytes(bucket)
	w.bytes(key)
}

func (w *changeWriter) seq(bucket []byte, seq uint64) {
	w.op(opSeq)
	w.bytes(bucket)
	w.buf.Write(binary.AppendUvarint(nil, seq))
}

// applyChanges writes a change set into btx.
func applyChanges(btx *bolt.Tx, changes []byte) error {
	r := changeReader{b: changes}
	for len(r.b) > 0 {
		op := r.b[0]
		r.b = r.b[1:]
		if op == opReset {
			for _, name := range allBuckets {
				if err := btx.DeleteBucket(name); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
					return err
				}
				if _, err := btx.CreateBucket(name); err != nil {
					return err
				}
			}
			continue
		}
		name := r.bytes()
		b := btx.Bucket(name)
		if r.err == nil && b == nil {
			return fmt.Errorf("%w: no bucket %q", ErrBadJournal, name)
		}
		var err error
		switch op {
		case opPut:
			k, v := r.bytes(), r.bytes()
			if r.err == nil {
				err = b.Put(k, v) // changes outlives the transaction (Apply)
			}
		case opDel:
			if k := r.bytes(); r.err == nil {
				err = b.Delete(k)
			}
		case opSeq:
			if seq := r.uvarint(); r.err == nil && seq > b.Sequence() {
				err = b.SetSequence(seq)
			}
		default:
			return fmt.Errorf("%w: operation %q", ErrBadJournal, op)
		}
		if r.err != nil {
			return r.err
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// changeReader decodes a change set; its first error sticks.
type changeReader struct {
	b   []byte
	err error
}

func (r *changeReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: a length or sequence is cut", ErrBadJournal)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *changeReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: %d bytes announced, %d left", ErrBadJournal, n, len(r.b))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// set puts key's value in bucket and journals it: every write of the database goes through
// set, del and nextSeq.
func (tx *Tx) set(bucket, key, val []byte) error {
	if err := tx.tx.Bucket(bucket).Put(key, val); err != nil {
		return err
	}
	if tx.rec != nil {
		tx.rec.put(bucket, key, val)
	}
	return nil
}

// del deletes key from bucket and journals it.
func (tx *Tx) del(bucket, key []byte) error {
	if err := tx.tx.Bucket(bucket).Delete(key); err != nil {
		return err
	}
	if tx.rec != nil {
		tx.rec.del(bucket, key)
	}
	return nil
}

// nextSeq is bucket's NextSequence, journaled so a database that follows numbers its next
// record as this one would.
func (tx *Tx) nextSeq(bucket []byte) (uint64, error) {
	seq, err := tx.tx.Bucket(bucket).NextSequence()
	if err == nil && tx.rec != nil {
		tx.rec.seq(bucket, seq)
	}
	return seq, err
}
