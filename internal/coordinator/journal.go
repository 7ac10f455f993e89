package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/coorddb"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// journalPart bounds one message of the journal: a transaction's changes above it go as
// several parts, applied together once the last has come (the server's default limit on a
// message is 1 MiB).
const journalPart = 256 << 10

// Headers of a journal message: which set of changes it belongs to and its place in it.
const (
	hdrJournalSet  = "Tilefarm-Journal-Set"
	hdrJournalPart = "Tilefarm-Journal-Part" // "i/n"
	// HeaderJournalWriter names the coordinator that wrote an entry (its leadership id), for
	// an operator reading the journal and the tests that prove a deposed leader wrote nothing.
	HeaderJournalWriter = "Tilefarm-Journal-Writer"
)

// journal is the farm's journal on JetStream as the coordinator's database writes it
// (coorddb.Journal): only during a term of leadership (open), each part published with the
// log's last sequence expected, so a coordinator whose database is behind the log, or one
// deposed that has not noticed yet, is refused by JetStream itself (docs/design.md,
// "Replication"). A refusal ends the term: the database may lack what the log holds.
type journal struct {
	js      jetstream.JetStream
	writer  string // HeaderJournalWriter
	leading atomic.Bool
	ended   chan struct{} // a term's end asked by a refusal; buffered
	failed  atomic.Value  // error: the last append's failure
	// await waits for a term of this coordinator's, or refuses naming the one that leads.
	await    func(context.Context) error
	refusals func()       // counts a refusal
	health   func() error // Config.JetStreamHealth; nil: never known
}

// Append publishes changes as the entries after sequence after.
func (j *journal) Append(ctx context.Context, after uint64, changes []byte) (uint64, error) {
	if !j.leading.Load() {
		if err := j.await(ctx); err != nil {
			return 0, err
		}
	}
	set := nuid.Next()
	n := (len(changes) + journalPart - 1) / journalPart
	seq := after
	for i := range n {
		m := nats.NewMsg(queue.JournalSubject)
		m.Data = changes[i*journalPart : min(len(changes), (i+1)*journalPart)]
		m.Header.Set(hdrJournalSet, set)
		m.Header.Set(hdrJournalPart, fmt.Sprintf("%d/%d", i+1, n))
		m.Header.Set(HeaderJournalWriter, j.writer)
		ack, err := j.js.PublishMsg(context.WithoutCancel(ctx), m, jetstream.WithExpectLastSequencePerSubject(seq))
		if err != nil {
			j.failed.Store(err)
			j.refuse()
			if herr := j.unhealthy(); herr != nil {
				return 0, herr // what JetStream cannot do, said as the process knows it
			}
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
				return 0, fmt.Errorf("%w: the farm's journal has entries past %d this coordinator does not hold (another coordinator wrote it): %v",
					api.ErrNotLeader, seq, err)
			}
			return 0, fmt.Errorf("%w: writing the farm's journal: %v", api.ErrUnavailable, err)
		}
		seq = ack.Sequence
	}
	return seq, nil
}

// unhealthy is why JetStream cannot store anything, when the process knows (Config.JetStreamHealth).
func (j *journal) unhealthy() error {
	if j.health == nil {
		return nil
	}
	return j.health()
}

// lastErr is the last append's failure, for the log of the term it ended.
func (j *journal) lastErr() error {
	if e, ok := j.failed.Load().(error); ok {
		return e
	}
	return nil
}

// refuse ends the term in progress: what the database holds may now be behind the log.
func (j *journal) refuse() {
	j.refusals()
	if j.leading.Swap(false) {
		select {
		case j.ended <- struct{}{}:
		default:
		}
	}
}

// errJournalGap is a journal that lacks entries a database needs to catch up, and no
// snapshot after them: the log was cut by hand, or lost.
var errJournalGap = errors.New("the farm's journal lacks entries")

// follow applies the journal's entries the database does not hold, in order. With toEnd it
// returns once it holds every entry the log had when it began; else it follows until ctx is
// done. Each applied entry wakes the projection's waiters, so a coordinator that does not lead
// answers status, watch and the monitor from its own copy.
func (c *Coordinator) follow(ctx context.Context, toEnd bool) error {
	from, err := c.db.Applied(ctx)
	if err != nil {
		return err
	}
	var last uint64
	if toEnd {
		info, err := c.queue.Journal.Info(ctx)
		if err != nil {
			return fmt.Errorf("reading the farm's journal: %w", err)
		}
		if last = info.State.LastSeq; from >= last {
			return nil
		}
	}
	cons, err := c.queue.Journal.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from + 1,
	})
	if err != nil {
		return fmt.Errorf("following the farm's journal: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("following the farm's journal: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	var set string
	var parts [][]byte
	gap := false
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("following the farm's journal: %w", err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		seq := meta.Sequence.Stream
		if seq > from+1 && len(parts) == 0 && !gap {
			gap = true // fine only if what comes is a snapshot
		}
		from = seq
		i, n, ok := journalPlace(msg.Headers().Get(hdrJournalPart))
		if !ok {
			return fmt.Errorf("%w: journal entry %d is no part of a set (%q)", coorddb.ErrBadJournal, seq, msg.Headers().Get(hdrJournalPart))
		}
		if id := msg.Headers().Get(hdrJournalSet); i == 1 || id != set || len(parts) != i-1 {
			// A set begins; one left unfinished was a leader's that died while writing it.
			set, parts = id, nil
			if i != 1 {
				continue
			}
		}
		parts = append(parts, msg.Data())
		if i < n {
			continue
		}
		changes := bytes.Join(parts, nil)
		parts = nil
		if gap {
			if !coorddb.IsSnapshot(changes) {
				return fmt.Errorf("%w before entry %d, which is no snapshot", errJournalGap, seq)
			}
			gap = false
		}
		if err := c.db.Apply(ctx, seq, changes); err != nil {
			return err
		}
		c.notify()
		if toEnd && seq >= last {
			return nil
		}
	}
}

// journalPlace parses "i/n".
func journalPlace(s string) (i, n int, ok bool) {
	a, b, found := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	return i, n, found && err1 == nil && err2 == nil && i >= 1 && i <= n
}

// term is one term of leadership: the database caught up with the journal (or the journal
// given a snapshot of a database it lacks), a first entry that fences every coordinator that
// led before, then the loops only the leader runs, until ctx is done or the journal refuses a
// write. token is the lease's revision.
func (c *Coordinator) term(ctx context.Context, token uint64, loops map[string]loop) error {
	start := c.now()
	err := c.follow(ctx, true)
	gap := errors.Is(err, errJournalGap)
	if gap {
		c.log.Warn("the farm's journal cannot rebuild this coordinator's records; writing them to it whole", "err", err)
	} else if err != nil {
		return fmt.Errorf("catching up with the farm's journal: %w", err)
	}
	c.journal.leading.Store(true)
	defer c.journal.leading.Store(false)
	select {
	case <-c.journal.ended: // a refusal of the term before
	default:
	}
	if err := c.giveJournalRecords(ctx, gap); err != nil {
		return err
	}
	if err := c.db.Update(ctx, func(tx *coorddb.Tx) error {
		return tx.PutTerm(coorddb.Term{Leader: c.leaderID, Address: c.cfg.Address, Token: token, Began: c.now()})
	}); err != nil {
		return fmt.Errorf("fencing the farm's journal: %w", err)
	}
	c.m.TakeOver.Observe(c.now().Sub(start).Seconds())
	c.log.Info("acting as the farm's leader", "token", token)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.journal.ended:
			c.log.Warn("the farm's journal refused a write or could not confirm it: catching up before acting again", "err", c.journal.lastErr())
			cancel()
		case <-tctx.Done():
		}
	}()
	runLoops(tctx, c.log, loops)
	return nil
}

// giveJournalRecords writes this database whole to the journal when the journal lacks what
// it holds: the journal has entries this database cannot catch up over (gap), or it is empty
// and the database is not (a farm whose coordinator ran before the journal).
func (c *Coordinator) giveJournalRecords(ctx context.Context, gap bool) error {
	seq, err := c.db.Applied(ctx)
	if err != nil || seq > 0 && !gap {
		return err
	}
	info, err := c.queue.Journal.Info(ctx)
	if err != nil {
		return fmt.Errorf("reading the farm's journal: %w", err)
	}
	if seq, err = c.db.WriteSnapshot(ctx, info.State.LastSeq); err != nil {
		return fmt.Errorf("writing this coordinator's records to the farm's journal: %w", err)
	}
	if seq > 0 {
		c.log.Info("wrote this coordinator's records to the farm's journal", "seq", seq)
	}
	return nil
}

// compactLoop compacts the farm's journal (compactJournal) when it holds more than
// Config.CompactJournalAt bytes and more than four times the database's size, looking every
// Config.CompactJournalEvery.
func (c *Coordinator) compactLoop(ctx context.Context) error {
	t := time.NewTicker(c.cfg.CompactJournalEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		info, err := c.queue.Journal.Info(ctx)
		if err != nil {
			return fmt.Errorf("reading the farm's journal: %w", err)
		}
		size, err := c.db.Size()
		if err != nil {
			return err
		}
		if info.State.Bytes < uint64(c.cfg.CompactJournalAt) || info.State.Bytes < 4*uint64(size) {
			continue
		}
		if err := c.compactJournal(ctx); err != nil {
			return err
		}
	}
}

// compactJournal writes the database whole to the journal and purges every entry before it: a
// coordinator that joins the farm, or one behind, then starts from that snapshot (follow takes
// a gap before a snapshot), and the journal stays about the size of the records.
func (c *Coordinator) compactJournal(ctx context.Context) error {
	seq, err := c.db.WriteSnapshot(ctx, 0)
	if err != nil || seq == 0 {
		return err
	}
	m, err := c.queue.Journal.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("reading the journal's snapshot: %w", err)
	}
	_, n, ok := journalPlace(m.Header.Get(hdrJournalPart))
	if !ok {
		return fmt.Errorf("%w: the journal's snapshot %d is no part of a set", coorddb.ErrBadJournal, seq)
	}
	first := seq - uint64(n-1) // the parts of a set are consecutive: each was appended after the one before
	before, err := c.queue.Journal.Info(ctx)
	if err != nil {
		return err
	}
	if err := c.queue.Journal.Purge(ctx, jetstream.WithPurgeSequence(first)); err != nil {
		return fmt.Errorf("purging the journal before its snapshot %d: %w", first, err)
	}
	c.log.Info("compacted the farm's journal", "snapshot", first, "entries_before", first-before.State.FirstSeq, "bytes_before", before.State.Bytes)
	return nil
}

// awaitLeading returns once this coordinator acts as the farm's leader, or refuses at once
// with the leader's address when another coordinator holds the lease. While none does, or this
// one holds it and is catching up (a start, a term ended by a refusal), it waits up to the
// lease TTL, the time an election takes: a write that comes to a coordinator starting up
// waits for it instead of failing.
func (c *Coordinator) awaitLeading(ctx context.Context) error {
	deadline := time.Now().Add(c.queue.Leases.TTL())
	for !c.journal.leading.Load() {
		if err := c.journal.unhealthy(); err != nil {
			return err // nothing can be journaled: no use waiting for a term
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		l, err := c.Leader(rctx)
		cancel()
		if err == nil && l != nil && !l.This {
			leader := l.Address
			if leader == "" {
				leader = "coordinator " + l.ID + " (its address unknown)"
			}
			return &api.NotLeaderError{Leader: leader}
		}
		if time.Now().After(deadline) {
			return &api.NotLeaderError{}
		}
		if !queue.Sleep(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}
