package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers a dead letter carries in the DLQ stream. HeaderLastError may also be set by a publisher on the
// original message as a fallback reason.
const (
	HeaderLastError    = "Tilefarm-Last-Error"
	HeaderDLQSubject   = "Tilefarm-Dlq-Subject"
	HeaderDLQMsgID     = "Tilefarm-Dlq-Msg-Id"
	HeaderDLQSeq       = "Tilefarm-Dlq-Seq"
	HeaderDLQDelivered = "Tilefarm-Dlq-Deliveries"

	dlqHeaderPrefix   = "Tilefarm-Dlq-"
	natsHeaderPrefix  = "Nats-"
	reasonMaxDelivers = "max deliveries exceeded"
)

// ErrDeadLetterNotFound is returned by RequeueDeadLetter for a DLQ sequence that holds no dead letter.
var ErrDeadLetterNotFound = errors.New("dead letter not found")

// DeadLetter is a message removed from TILES after it could not be processed, with its error context.
type DeadLetter struct {
	// DLQSeq is the dead letter's own sequence in the DLQ stream, the handle for RequeueDeadLetter; it is
	// 0 in a DeadLetter that has not been stored yet.
	DLQSeq uint64
	// StreamSeq is the original sequence in TILES.
	StreamSeq uint64
	// Subject is the original subject (tiles.render or tiles.assemble).
	Subject string
	// MsgID is the original Nats-Msg-Id.
	MsgID string
	Data  []byte
	// Header holds the original application headers (Nats-* and DLQ bookkeeping headers removed).
	Header     nats.Header
	Deliveries uint64
	Reason     string
	// Time is when the dead letter was stored.
	Time time.Time
}

// deadLetterMsgID is the DLQ publish id: a second copy of the same TILES message (a repeated advisory, two
// watchers, a retry after a crash between copy and delete) is deduplicated.
func deadLetterMsgID(streamSeq uint64, msgID string) string {
	return fmt.Sprintf("dlq:%d:%s", streamSeq, msgID)
}

// storeDeadLetter copies dl into the DLQ stream and returns it with DLQSeq and Time filled in.
func (f *Farm) storeDeadLetter(ctx context.Context, dl DeadLetter) (DeadLetter, error) {
	m := &nats.Msg{Subject: dlqPrefix + dl.Subject, Data: dl.Data, Header: nats.Header{}}
	for k, v := range dl.Header {
		if !strings.HasPrefix(k, natsHeaderPrefix) && !strings.HasPrefix(k, dlqHeaderPrefix) {
			m.Header[k] = append([]string(nil), v...)
		}
	}
	m.Header.Set(HeaderDLQSubject, dl.Subject)
	m.Header.Set(HeaderDLQMsgID, dl.MsgID)
	m.Header.Set(HeaderDLQSeq, strconv.FormatUint(dl.StreamSeq, 10))
	m.Header.Set(HeaderDLQDelivered, strconv.FormatUint(dl.Deliveries, 10))
	m.Header.Set(HeaderLastError, dl.Reason)
	ack, err := f.JS.PublishMsg(ctx, m, jetstream.WithMsgID(deadLetterMsgID(dl.StreamSeq, dl.MsgID)))
	if err != nil {
		return dl, fmt.Errorf("dead-lettering %s seq %d (%q): %w", StreamTiles, dl.StreamSeq, dl.MsgID, err)
	}
	dl.DLQSeq = ack.Sequence
	dl.Time = time.Now().UTC()
	return dl, nil
}

// reasonFor picks the most specific failure reason known for a message about to be dead-lettered.
func (f *Farm) reasonFor(msgID string, hdr nats.Header) string {
	if r := f.notedError(msgID); r != "" {
		return r
	}
	if r := hdr.Get(HeaderLastError); r != "" {
		return r
	}
	return reasonMaxDelivers
}

// deadLetterSeq moves TILES message seq to the DLQ: copy first, then delete. ok is false when the message is
// already gone (handled before, or acked late by a worker that did finish it).
func (f *Farm) deadLetterSeq(ctx context.Context, seq, deliveries uint64) (dl DeadLetter, ok bool, err error) {
	raw, err := f.Tiles.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return DeadLetter{}, false, nil
		}
		return DeadLetter{}, false, fmt.Errorf("loading %s seq %d for dead-lettering: %w", StreamTiles, seq, err)
	}
	msgID := raw.Header.Get(jetstream.MsgIDHeader)
	dl, err = f.storeDeadLetter(ctx, DeadLetter{
		StreamSeq:  seq,
		Subject:    raw.Subject,
		MsgID:      msgID,
		Data:       raw.Data,
		Header:     appHeaders(raw.Header),
		Deliveries: deliveries,
		Reason:     f.reasonFor(msgID, raw.Header),
	})
	if err != nil {
		return DeadLetter{}, false, err
	}
	if err := f.Tiles.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, false, fmt.Errorf("deleting dead-lettered %s seq %d: %w", StreamTiles, seq, err)
	}
	f.forgetError(msgID)
	return dl, true, nil
}

// WatchDeadLetters moves every TILES message that reached MaxDeliver to the DLQ and then calls onDead (nil
// is allowed). It listens to the MAX_DELIVERIES advisory and, because advisories are fire-and-forget core
// NATS messages lost while nobody listens, also sweeps TILES every Cfg.SweepInterval. It runs until ctx is
// done and then returns nil; per-message failures are logged and retried by the next sweep.
func (f *Farm) WatchDeadLetters(ctx context.Context, nc *nats.Conn, onDead func(DeadLetter)) error {
	subject := fmt.Sprintf("%s.%s.%s", server.JSAdvisoryConsumerMaxDeliveryExceedPre, StreamTiles, ConsumerWorkers)
	ch := make(chan *nats.Msg, 1024) // on overflow the advisory is dropped; the sweep still finds the tile
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		return fmt.Errorf("subscribing to %q: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second) // FlushWithContext needs a deadline
	err = nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("subscribing to %q: %w", subject, err)
	}
	log := f.logger().With("stream", StreamTiles, "consumer", ConsumerWorkers)
	dead := func(dl DeadLetter) {
		log.Warn("tile dead-lettered", "msg_id", dl.MsgID, "stream_seq", dl.StreamSeq, "dlq_seq", dl.DLQSeq,
			"deliveries", dl.Deliveries, "reason", dl.Reason)
		if onDead != nil {
			onDead(dl)
		}
	}
	sw := sweeper{f: f}
	sw.sweep(ctx, dead, log)
	ticker := time.NewTicker(f.Cfg.SweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			sw.sweep(ctx, dead, log)
		case m := <-ch:
			var adv server.JSConsumerDeliveryExceededAdvisory
			if err := json.Unmarshal(m.Data, &adv); err != nil {
				log.Error("decoding max deliveries advisory", "err", err)
				continue
			}
			dl, ok, err := f.deadLetterSeq(ctx, adv.StreamSeq, adv.Deliveries)
			if err != nil {
				if ctx.Err() == nil {
					log.Error("dead-lettering from advisory", "stream_seq", adv.StreamSeq, "err", err)
				}
				continue
			}
			if ok {
				dead(dl)
			}
		}
	}
}

// sweeper finds dead tiles without an advisory. In a work-queue stream an acked message is removed, so one
// still stored at or below the consumer's ack floor was given up by the consumer after MaxDeliver. The floor
// moves a moment before an acked message is removed, so a candidate is dead-lettered only when two
// consecutive sweeps both see it.
type sweeper struct {
	f    *Farm
	prev map[uint64]bool
}

// sweep runs one pass; errors are logged because the next pass retries.
func (s *sweeper) sweep(ctx context.Context, dead func(DeadLetter), log *slog.Logger) {
	cands, err := s.f.deadCandidates(ctx)
	ci, _ := s.f.Consumer.Info(ctx)
	si, _ := s.f.Tiles.Info(ctx)
	log.Info("DEBUG sweep", "cands", cands, "prev", s.prev, "err", err, "floor", ci.AckFloor, "state", si.State)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("sweeping for dead tiles", "err", err)
		}
		return
	}
	next := make(map[uint64]bool, len(cands))
	for _, seq := range cands {
		if !s.prev[seq] {
			next[seq] = true
			continue
		}
		dl, ok, err := s.f.deadLetterSeq(ctx, seq, uint64(s.f.Cfg.MaxDeliver))
		if err != nil {
			if ctx.Err() == nil {
				log.Error("dead-lettering from sweep", "stream_seq", seq, "err", err)
			}
			next[seq] = true // still confirmed; retry next pass
			continue
		}
		if ok {
			dead(dl)
		}
	}
	s.prev = next
}

// deadCandidates lists TILES sequences at or below the consumer's stream ack floor that are still stored.
func (f *Farm) deadCandidates(ctx context.Context) ([]uint64, error) {
	ci, err := f.Consumer.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading consumer %s/%s: %w", StreamTiles, ConsumerWorkers, err)
	}
	floor := ci.AckFloor.Stream
	si, err := f.Tiles.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", StreamTiles, err)
	}
	var out []uint64
	for seq := si.State.FirstSeq; seq > 0 && seq <= floor; {
		raw, err := f.Tiles.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(tilesSubjects))
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			return nil, fmt.Errorf("scanning %s at seq %d: %w", StreamTiles, seq, err)
		}
		if raw.Sequence > floor {
			break
		}
		out = append(out, raw.Sequence)
		seq = raw.Sequence + 1
	}
	return out, nil
}

// DeadLetterNow dead-letters msg at once with reason (terminal errors: invalid scene, deterministic panic).
// It copies the payload to the DLQ first and only then Terms the message, because Term deletes a
// work-queue message immediately.
func (f *Farm) DeadLetterNow(ctx context.Context, msg jetstream.Msg, reason string) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("dead-lettering message on %q: reading metadata: %w", msg.Subject(), err)
	}
	hdr := msg.Headers()
	msgID := hdr.Get(jetstream.MsgIDHeader)
	if reason == "" {
		reason = f.reasonFor(msgID, hdr)
	}
	if _, err := f.storeDeadLetter(ctx, DeadLetter{
		StreamSeq:  meta.Sequence.Stream,
		Subject:    msg.Subject(),
		MsgID:      msgID,
		Data:       msg.Data(),
		Header:     appHeaders(hdr),
		Deliveries: meta.NumDelivered,
		Reason:     reason,
	}); err != nil {
		return err
	}
	if err := msg.Term(); err != nil {
		return fmt.Errorf("terminating dead-lettered %s seq %d (%q): %w", StreamTiles, meta.Sequence.Stream, msgID, err)
	}
	f.forgetError(msgID)
	return nil
}

// ListDeadLetters returns every dead letter in the DLQ, oldest first.
func (f *Farm) ListDeadLetters(ctx context.Context) ([]DeadLetter, error) {
	info, err := f.DLQ.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	var out []DeadLetter
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; {
		raw, err := f.DLQ.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(dlqSubjects))
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			return nil, fmt.Errorf("listing dead letters at seq %d: %w", seq, err)
		}
		out = append(out, decodeDeadLetter(raw))
		seq = raw.Sequence + 1
	}
	return out, nil
}

// RequeueDeadLetter puts a dead letter back on its original subject with Msg-Id "<msgid>:requeue:<dlq seq>"
// (a fresh id, since the original may still be blocked by the dedup window) and then deletes it from the DLQ.
// A crash between the two repeats the publish, which the dedup window absorbs.
func (f *Farm) RequeueDeadLetter(ctx context.Context, dlqSeq uint64) error {
	raw, err := f.DLQ.GetMsg(ctx, dlqSeq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("requeueing dead letter %d: %w", dlqSeq, ErrDeadLetterNotFound)
		}
		return fmt.Errorf("requeueing dead letter %d: %w", dlqSeq, err)
	}
	dl := decodeDeadLetter(raw)
	if dl.Subject == "" || !strings.HasPrefix(dl.Subject, "tiles.") {
		return fmt.Errorf("requeueing dead letter %d: original subject %q is not a tiles subject", dlqSeq, dl.Subject)
	}
	hdr := appHeaders(dl.Header)
	hdr.Del(HeaderLastError) // the requeued attempt starts with a clean slate
	id := fmt.Sprintf("%s:requeue:%d", dl.MsgID, dlqSeq)
	if _, err := f.Publish(ctx, dl.Subject, id, dl.Data, hdr); err != nil {
		return fmt.Errorf("requeueing dead letter %d: %w", dlqSeq, err)
	}
	if err := f.DLQ.DeleteMsg(ctx, dlqSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("requeueing dead letter %d: deleting it from %s: %w", dlqSeq, StreamDLQ, err)
	}
	return nil
}

// decodeDeadLetter rebuilds a DeadLetter from its DLQ message.
func decodeDeadLetter(raw *jetstream.RawStreamMsg) DeadLetter {
	dl := DeadLetter{
		DLQSeq:  raw.Sequence,
		Subject: raw.Header.Get(HeaderDLQSubject),
		MsgID:   raw.Header.Get(HeaderDLQMsgID),
		Data:    raw.Data,
		Header:  appHeaders(raw.Header),
		Reason:  raw.Header.Get(HeaderLastError),
		Time:    raw.Time,
	}
	dl.Header.Del(HeaderLastError)
	if dl.Subject == "" {
		dl.Subject = strings.TrimPrefix(raw.Subject, dlqPrefix)
	}
	dl.StreamSeq, _ = strconv.ParseUint(raw.Header.Get(HeaderDLQSeq), 10, 64)
	dl.Deliveries, _ = strconv.ParseUint(raw.Header.Get(HeaderDLQDelivered), 10, 64)
	return dl
}

// appHeaders copies h without server (Nats-*) and DLQ bookkeeping headers.
func appHeaders(h nats.Header) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		if !strings.HasPrefix(k, natsHeaderPrefix) && !strings.HasPrefix(k, dlqHeaderPrefix) {
			out[k] = append([]string(nil), v...)
		}
	}
	return out
}
