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
	"github.com/tilefarm/tilefarm/internal/api"
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

// deadLetterMsgID is the DLQ publish id: a second copy of the same TILES message (a repeated advisory, two
// watchers, a retry after a crash between copy and delete) is deduplicated.
func deadLetterMsgID(streamSeq uint64, msgID string) string {
	return fmt.Sprintf("dlq:%d:%s", streamSeq, msgID)
}

// storeDeadLetter copies dl into the DLQ stream and returns it with DLQSeq and Time filled in.
func (f *Queue) storeDeadLetter(ctx context.Context, dl api.DeadLetter) (api.DeadLetter, error) {
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

// reasonFor is the failure reason of a message about to be dead-lettered: the one its
// publisher set, else that it ran out of deliveries.
func reasonFor(hdr nats.Header) string {
	if r := hdr.Get(HeaderLastError); r != "" {
		return r
	}
	return reasonMaxDelivers
}

// loadDeadLetter reads TILES message seq as a dead letter not stored yet. ok is false when the
// message is already gone: dead-lettered before, or acked late by a worker that did finish it.
func (f *Queue) loadDeadLetter(ctx context.Context, seq, deliveries uint64) (dl api.DeadLetter, ok bool, err error) {
	raw, err := f.Tiles.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return api.DeadLetter{}, false, nil
		}
		return api.DeadLetter{}, false, fmt.Errorf("loading %s seq %d for dead-lettering: %w", StreamTiles, seq, err)
	}
	msgID := raw.Header.Get(jetstream.MsgIDHeader)
	return api.DeadLetter{
		StreamSeq:  seq,
		Subject:    raw.Subject,
		MsgID:      msgID,
		Data:       raw.Data,
		Header:     appHeaders(raw.Header),
		Deliveries: deliveries,
		Reason:     reasonFor(raw.Header),
	}, true, nil
}

// removeDeadLetter deletes a dead letter's original from TILES once its copy is stored.
func (f *Queue) removeDeadLetter(ctx context.Context, dl api.DeadLetter) error {
	if err := f.Tiles.DeleteMsg(ctx, dl.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("deleting dead-lettered %s seq %d: %w", StreamTiles, dl.StreamSeq, err)
	}
	return nil
}

// maxDeliveriesSubject is where the server announces that a TILES consumer gave up on a message.
const maxDeliveriesSubject = server.JSAdvisoryConsumerMaxDeliveryExceedPre + "." + StreamTiles + ".*"

// advisoryRetryBase and advisoryRetryMax bound the redelivery delay of an advisory whose dead-lettering
// failed (DLQ unavailable, for example).
const (
	advisoryRetryBase = time.Second
	advisoryRetryMax  = time.Minute
)

// DeadLetterHandler settles the messages the queue gave up on. It is declared here, where the
// watcher uses it; the coordinator implements it.
type DeadLetterHandler interface {
	// Promoted reports whether the message's work is done after all (its manifest exists; its
	// last ack was lost) and, if so, records that. The message is then deleted from TILES
	// without a dead letter: nothing promoted is ever dead-lettered.
	Promoted(ctx context.Context, dl api.DeadLetter) (bool, error)
	// Record records a dead letter stored in the DLQ. It is called at least once per dead
	// letter (a crash repeats it), so it must be idempotent.
	Record(ctx context.Context, dl api.DeadLetter) error
}

// handleBatch handles a batch's advisories as they arrive; it returns false as soon as ctx
// ends, without waiting for the pull to expire, so a coordinator stops at once.
func (f *Queue) handleBatch(ctx context.Context, batch jetstream.MessageBatch, h DeadLetterHandler, log *slog.Logger) bool {
	msgs := batch.Messages()
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return true
			}
			f.handleAdvisory(ctx, m, h, log)
		case <-ctx.Done():
			return false
		}
	}
}

// WatchDeadLetters settles every TILES message that reached MaxDeliver. It reads the
// $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.TILES.* advisories from the TILES_ADVISORIES stream that
// Setup creates to capture them, through the shared durable consumer "dead-letters": an advisory raised
// while no coordinator was running is handled when one starts, and several coordinators can watch at once.
// Per advisory: ask h whether the message's work is promoted (then delete it), else copy it to
// "dlq.<subject>", record it with h, delete it from TILES, ack the advisory. A crash anywhere in that
// sequence repeats it from the start; the DLQ copy is deduplicated. An error from h leaves the message in
// TILES and the advisory is redelivered with backoff. nc carries the watcher's traffic (nil means f.JS's
// connection). It runs until ctx is done, then returns nil.
func (f *Queue) WatchDeadLetters(ctx context.Context, nc *nats.Conn, h DeadLetterHandler) error {
	js := f.JS
	if nc != nil {
		var err error
		if js, err = jetstream.New(nc); err != nil {
			return fmt.Errorf("watching dead letters: %w", err)
		}
	}
	cons, err := js.Consumer(ctx, StreamAdvisories, ConsumerDeadLetters)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watching dead letters: opening consumer %s/%s: %w", StreamAdvisories, ConsumerDeadLetters, err)
	}
	log := f.logger().With("stream", StreamTiles)
	for ctx.Err() == nil {
		// A server-side expiry, so no advisory is delivered to a pull the client gave up on.
		batch, err := cons.Fetch(64, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, nats.ErrConnectionClosed) {
				return fmt.Errorf("watching dead letters: %w", err)
			}
			log.Error("fetching max deliveries advisories", "err", err)
			if !Sleep(ctx, advisoryRetryBase) {
				return nil
			}
			continue
		}
		if !f.handleBatch(ctx, batch, h, log) {
			return nil // shutting down: an advisory still delivered is redelivered after its ack-wait
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) {
			log.Error("fetching max deliveries advisories", "err", err)
			if !Sleep(ctx, advisoryRetryBase) {
				return nil
			}
		}
	}
	return nil
}

// handleAdvisory settles the TILES message one advisory names, then the advisory.
func (f *Queue) handleAdvisory(ctx context.Context, m jetstream.Msg, h DeadLetterHandler, log *slog.Logger) {
	var adv server.JSConsumerDeliveryExceededAdvisory
	if err := json.Unmarshal(m.Data(), &adv); err != nil || adv.StreamSeq == 0 {
		log.Error("dropping undecodable max deliveries advisory", "err", err, "data", string(m.Data()))
		_ = m.Term()
		return
	}
	retry := func(err error) {
		attempt := 1
		if md, merr := m.Metadata(); merr == nil {
			attempt = int(min(md.NumDelivered, 64))
		}
		if ctx.Err() == nil {
			log.Error("dead-lettering", "stream_seq", adv.StreamSeq, "attempt", attempt, "err", err)
		}
		_ = m.NakWithDelay(Backoff(attempt, advisoryRetryBase, advisoryRetryMax, CryptoJitter))
	}
	dl, ok, err := f.loadDeadLetter(ctx, adv.StreamSeq, adv.Deliveries)
	if err != nil {
		retry(err)
		return
	}
	if ok {
		promoted := false
		if h != nil {
			if promoted, err = h.Promoted(ctx, dl); err != nil {
				retry(fmt.Errorf("checking whether the work is promoted: %w", err))
				return
			}
		}
		if promoted {
			log.Info("message reached max deliveries but its work is promoted; deleting it", "msg_id", dl.MsgID, "stream_seq", dl.StreamSeq)
		} else {
			if dl, err = f.storeDeadLetter(ctx, dl); err != nil {
				retry(err)
				return
			}
			log.Warn("dead-lettered", "msg_id", dl.MsgID, "stream_seq", dl.StreamSeq, "dlq_seq", dl.DLQSeq,
				"deliveries", dl.Deliveries, "reason", dl.Reason)
			if h != nil {
				if err := h.Record(ctx, dl); err != nil {
					// Keep the message in TILES: the advisory comes back and it is recorded then.
					retry(fmt.Errorf("recording dead letter: %w", err))
					return
				}
			}
		}
		if err := f.removeDeadLetter(ctx, dl); err != nil {
			retry(err)
			return
		}
	}
	if err := m.Ack(); err != nil {
		// The advisory comes back, finds the message gone and is acked then: harmless.
		log.Warn("acking max deliveries advisory", "stream_seq", adv.StreamSeq, "err", err)
	}
}

// Sleep waits d or until ctx is done; it reports whether the full wait elapsed. Every retry
// loop of the farm waits with it, so a shutdown never waits out a backoff.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// DeadLetterNow dead-letters msg at once with reason (terminal errors: invalid scene, deterministic panic).
// It copies the payload to the DLQ first and only then Terms the message, because Term deletes a
// work-queue message immediately.
func (f *Queue) DeadLetterNow(ctx context.Context, msg jetstream.Msg, reason string) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("dead-lettering message on %q: reading metadata: %w", msg.Subject(), err)
	}
	hdr := msg.Headers()
	msgID := hdr.Get(jetstream.MsgIDHeader)
	if reason == "" {
		reason = reasonFor(hdr)
	}
	if _, err := f.storeDeadLetter(ctx, api.DeadLetter{
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
	return nil
}

// ListDeadLetters returns every dead letter in the DLQ, oldest first.
func (f *Queue) ListDeadLetters(ctx context.Context) ([]api.DeadLetter, error) {
	info, err := f.DLQ.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	var out []api.DeadLetter
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
func (f *Queue) RequeueDeadLetter(ctx context.Context, dlqSeq uint64) (api.DeadLetter, error) {
	raw, err := f.DLQ.GetMsg(ctx, dlqSeq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return api.DeadLetter{}, fmt.Errorf("requeueing dead letter %d: %w", dlqSeq, ErrDeadLetterNotFound)
		}
		return api.DeadLetter{}, fmt.Errorf("requeueing dead letter %d: %w", dlqSeq, err)
	}
	dl := decodeDeadLetter(raw)
	if dl.Subject == "" || !strings.HasPrefix(dl.Subject, "tiles.") {
		return api.DeadLetter{}, fmt.Errorf("requeueing dead letter %d: original subject %q is not a tiles subject", dlqSeq, dl.Subject)
	}
	hdr := appHeaders(dl.Header)
	hdr.Del(HeaderLastError) // the requeued attempt starts with a clean slate
	id := fmt.Sprintf("%s:requeue:%d", dl.MsgID, dlqSeq)
	if _, err := f.Publish(ctx, dl.Subject, id, dl.Data, hdr); err != nil {
		return api.DeadLetter{}, fmt.Errorf("requeueing dead letter %d: %w", dlqSeq, err)
	}
	if err := f.DLQ.DeleteMsg(ctx, dlqSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return api.DeadLetter{}, fmt.Errorf("requeueing dead letter %d: deleting it from %s: %w", dlqSeq, StreamDLQ, err)
	}
	return dl, nil
}

// decodeDeadLetter rebuilds a DeadLetter from its DLQ message.
func decodeDeadLetter(raw *jetstream.RawStreamMsg) api.DeadLetter {
	dl := api.DeadLetter{
		DLQSeq:  raw.Sequence,
		Subject: raw.Header.Get(HeaderDLQSubject),
		MsgID:   raw.Header.Get(HeaderDLQMsgID),
		Data:    raw.Data,
		Header:  appHeaders(raw.Header),
		Reason:  raw.Header.Get(HeaderLastError),
		Time:    raw.Time,
	}
	nats.Header(dl.Header).Del(HeaderLastError)
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
