package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

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

// HeaderMsgID is the id of a tile render job (coordinator.TileMsgID): what the farm counts a
// message's failures and hand-backs by and names its dead letter with. A tile carries it in
// this header rather than in Nats-Msg-Id, so the stream keeps no dedup entry per tile, which at
// a million tiles queued was most of the coordinator's memory (docs/design.md, "Dispatch").
const HeaderMsgID = "Tilefarm-Msg-Id"

// MsgID is the id of a TILES message: its HeaderMsgID, else its Nats-Msg-Id (an assembly, a
// requeued dead letter, a tile of an older coordinator).
func MsgID(h nats.Header) string {
	if id := h.Get(HeaderMsgID); id != "" {
		return id
	}
	return h.Get(jetstream.MsgIDHeader)
}

// ErrDeadLetterNotFound is returned by RequeueDeadLetter for a DLQ sequence that holds no dead letter.
var ErrDeadLetterNotFound = errors.New("dead letter not found")

// deadLetterMsgID is the DLQ publish id: a second copy of the same TILES message (a retry after
// a crash between copy and term) is deduplicated.
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

// reasonFor is the failure reason of a message about to be dead-lettered without one: the one
// its publisher set, else that it ran out of deliveries.
func reasonFor(hdr nats.Header) string {
	if r := hdr.Get(HeaderLastError); r != "" {
		return r
	}
	return reasonMaxDelivers
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
	msgID := MsgID(hdr)
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

// DeadLetter returns the dead letter at DLQ sequence dlqSeq, ErrDeadLetterNotFound if none.
func (f *Queue) DeadLetter(ctx context.Context, dlqSeq uint64) (api.DeadLetter, error) {
	raw, err := f.DLQ.GetMsg(ctx, dlqSeq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return api.DeadLetter{}, fmt.Errorf("dead letter %d: %w", dlqSeq, ErrDeadLetterNotFound)
		}
		return api.DeadLetter{}, fmt.Errorf("reading dead letter %d: %w", dlqSeq, err)
	}
	return decodeDeadLetter(raw), nil
}

// RequeueDeadLetter puts a dead letter back on its original subject with Msg-Id "<msgid>:requeue:<dlq seq>"
// (a fresh id, since the original may still be blocked by the dedup window) and then deletes it from the DLQ.
// A crash between the two repeats the publish, which the dedup window absorbs.
// RequeueOpt is an option of RequeueDeadLetter.
type RequeueOpt func(*requeueOpts)

type requeueOpts struct {
	route func(ctx context.Context, dl api.DeadLetter) (string, error)
}

// RequeueTo has RequeueDeadLetter publish the dead letter on the subject route returns for it,
// "" for its own: the coordinator's, for a tile whose pool was retired or whose frame is
// dispatched elsewhere now.
func RequeueTo(route func(ctx context.Context, dl api.DeadLetter) (string, error)) RequeueOpt {
	return func(o *requeueOpts) { o.route = route }
}

func (f *Queue) RequeueDeadLetter(ctx context.Context, dlqSeq uint64, opts ...RequeueOpt) (api.DeadLetter, error) {
	var o requeueOpts
	for _, opt := range opts {
		opt(&o)
	}
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
	hdr.Del(HeaderMsgID)     // and with its own id, so its failures count afresh
	id := fmt.Sprintf("%s:requeue:%d", dl.MsgID, dlqSeq)
	subject := dl.Subject
	if o.route != nil {
		to, err := o.route(ctx, dl)
		if err != nil {
			return api.DeadLetter{}, fmt.Errorf("requeueing dead letter %d: %w", dlqSeq, err)
		}
		subject = cmp.Or(to, subject)
	}
	if _, err := f.Publish(ctx, subject, id, dl.Data, hdr); err != nil {
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
