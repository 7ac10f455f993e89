package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/tilefarm/tilefarm/internal/api"
)

// advisoryMsg is a MAX_DELIVERIES advisory as the dead-letter watcher fetches it, recording how
// it was settled. Only what handleAdvisory calls is implemented; anything else panics.
type advisoryMsg struct {
	jetstream.Msg
	data                []byte
	acks, terms, delays int
}

func (m *advisoryMsg) Data() []byte                     { return m.data }
func (m *advisoryMsg) Ack() error                       { m.acks++; return nil }
func (m *advisoryMsg) Term() error                      { m.terms++; return nil }
func (m *advisoryMsg) NakWithDelay(time.Duration) error { m.delays++; return nil }
func (m *advisoryMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return nil, errors.New("no metadata")
}

// fakeTiles stands in for the TILES stream. Which message a sequence finds is decided by the
// sequence itself, so every branch of handleAdvisory is reachable from the advisory's bytes:
// seq%4 == 0 is gone (acked late, or dead-lettered before), 1 is a render job, 2 an assemble
// job, 3 a stream that is unavailable.
type fakeTiles struct {
	jetstream.Stream
	gets, deletes []uint64
}

var errUnavailable = errors.New("stream unavailable")

func (s *fakeTiles) GetMsg(_ context.Context, seq uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	s.gets = append(s.gets, seq)
	subject := SubjectRender
	switch seq % 4 {
	case 0:
		return nil, jetstream.ErrMsgNotFound
	case 2:
		subject = SubjectAssemble
	case 3:
		return nil, errUnavailable
	}
	return &jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Data: []byte("job"),
		Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprintf("msg-%d", seq)}, "App": {"a"}}}, nil
}

func (s *fakeTiles) DeleteMsg(_ context.Context, seq uint64) error {
	s.deletes = append(s.deletes, seq)
	return nil
}

// fakeJS stands in for JetStream: it stores what is published (the DLQ copies).
type fakeJS struct {
	jetstream.JetStream
	published []*nats.Msg
}

func (js *fakeJS) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	js.published = append(js.published, m)
	return &jetstream.PubAck{Stream: StreamDLQ, Sequence: uint64(len(js.published))}, nil
}

// fakeHandler is the coordinator's side: work of seq%5 == 0 is promoted, and recording the
// dead letter of seq%7 == 0 fails.
type fakeHandler struct {
	promoted, recorded []api.DeadLetter
}

func (h *fakeHandler) Promoted(_ context.Context, dl api.DeadLetter) (bool, error) {
	h.promoted = append(h.promoted, dl)
	return dl.StreamSeq%5 == 0, nil
}

func (h *fakeHandler) Record(_ context.Context, dl api.DeadLetter) error {
	h.recorded = append(h.recorded, dl)
	if dl.StreamSeq%7 == 0 {
		return errors.New("database unavailable")
	}
	return nil
}

// FuzzDeadLetterAdvisory: handleAdvisory decodes MAX_DELIVERIES advisories, bytes the server
// (or anyone who can publish on the advisory subject) puts in TILES_ADVISORIES. Whatever it is
// given, it never panics and settles the advisory exactly once: one it cannot decode, or that
// names no stream sequence, is terminated and touches nothing else; otherwise it loads exactly
// the message named and
//   - acks when the message is gone,
//   - deletes promoted work without a dead letter, then acks,
//   - else copies the message to dlq.<subject> with its sequence and deliveries, records that
//     copy, deletes the original and acks,
//   - and, when loading or recording fails, keeps the message and asks for the advisory again.
//
// The streams, JetStream and the handler are fakes, so no server is needed.
func FuzzDeadLetterAdvisory(f *testing.F) {
	for _, seq := range []uint64{1, 2, 3, 4, 5, 7, 14, 35, 1<<64 - 1} {
		adv := server.JSConsumerDeliveryExceededAdvisory{
			TypedEvent: server.TypedEvent{Type: server.JSConsumerDeliveryExceededAdvisoryType, ID: "adv" + strconv.FormatUint(seq, 10),
				Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
			Stream: StreamTiles, Consumer: ConsumerWorkers, StreamSeq: seq, Deliveries: 20,
		}
		b, err := json.Marshal(adv)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, raw := range []string{
		``, `{`, `null`, `[]`, `{}`, `"x"`,
		`{"stream_seq": 0, "deliveries": 20}`,
		`{"stream_seq": -1}`,
		`{"stream_seq": 1.5}`,
		`{"stream_seq": 18446744073709551616}`,
		`{"stream_seq": "1"}`,
		`{"stream_seq": 1, "deliveries": 18446744073709551615, "timestamp": "yesterday"}`,
		`{"type": "io.nats.jetstream.advisory.v1.max_deliver", "stream": "OTHER", "consumer": "x", "stream_seq": 6, "deliveries": 0, "domain": "\u0000"}`,
		`{"STREAM_SEQ": 9, "Deliveries": 3}`,
		`{"stream_seq": 10, "stream_seq": 0}`,
		"\xff\xfe",
	} {
		f.Add([]byte(raw))
	}
	log := slog.New(slog.DiscardHandler)
	f.Fuzz(func(t *testing.T, data []byte) {
		tiles, js, h := &fakeTiles{}, &fakeJS{}, &fakeHandler{}
		farm := &Queue{JS: js, Tiles: tiles, Log: log}
		m := &advisoryMsg{data: data}
		farm.handleAdvisory(context.Background(), m, h, log)

		if n := m.acks + m.terms + m.delays; n != 1 {
			t.Fatalf("advisory settled %d times (%d acks, %d terms, %d naks)", n, m.acks, m.terms, m.delays)
		}
		var adv server.JSConsumerDeliveryExceededAdvisory
		if err := json.Unmarshal(data, &adv); err != nil || adv.StreamSeq == 0 {
			if m.terms != 1 || len(tiles.gets)+len(tiles.deletes)+len(js.published)+len(h.promoted)+len(h.recorded) != 0 {
				t.Fatalf("undecodable advisory (%v, seq %d) was not only terminated", err, adv.StreamSeq)
			}
			return
		}
		seq := adv.StreamSeq
		if m.terms != 0 {
			t.Fatalf("advisory for seq %d was terminated", seq)
		}
		if len(tiles.gets) != 1 || tiles.gets[0] != seq {
			t.Fatalf("advisory for seq %d loaded %v", seq, tiles.gets)
		}
		settled := func(acked bool, deleted bool, published, promoted, recorded int) {
			t.Helper()
			if (m.acks == 1) != acked || (len(tiles.deletes) == 1 && tiles.deletes[0] == seq) != deleted ||
				(!deleted && len(tiles.deletes) != 0) || len(js.published) != published ||
				len(h.promoted) != promoted || len(h.recorded) != recorded {
				t.Fatalf("seq %d: %d acks, %d naks, deleted %v, %d published, %d promoted checks, %d recorded; want acked %v, deleted %v, %d, %d, %d",
					seq, m.acks, m.delays, tiles.deletes, len(js.published), len(h.promoted), len(h.recorded),
					acked, deleted, published, promoted, recorded)
			}
		}
		switch {
		case seq%4 == 0: // gone
			settled(true, false, 0, 0, 0)
			return
		case seq%4 == 3: // unavailable: asked for again
			settled(false, false, 0, 0, 0)
			return
		}
		if dl := h.promoted[0]; dl.StreamSeq != seq || dl.Deliveries != adv.Deliveries || dl.MsgID != fmt.Sprintf("msg-%d", seq) {
			t.Fatalf("asked whether %+v is promoted, for seq %d after %d deliveries", dl, seq, adv.Deliveries)
		}
		if seq%5 == 0 { // promoted: deleted without a dead letter
			settled(true, true, 0, 1, 0)
			return
		}
		if len(js.published) != 1 {
			t.Fatalf("seq %d: %d dead letters published, want 1", seq, len(js.published))
		}
		p := js.published[0]
		subject := SubjectRender
		if seq%4 == 2 {
			subject = SubjectAssemble
		}
		if p.Subject != dlqPrefix+subject || p.Header.Get(HeaderDLQSubject) != subject ||
			p.Header.Get(HeaderDLQSeq) != strconv.FormatUint(seq, 10) ||
			p.Header.Get(HeaderDLQDelivered) != strconv.FormatUint(adv.Deliveries, 10) ||
			p.Header.Get(HeaderDLQMsgID) != fmt.Sprintf("msg-%d", seq) || p.Header.Get(HeaderLastError) != reasonMaxDelivers ||
			p.Header.Get("App") != "a" || p.Header.Get(jetstream.MsgIDHeader) != "" {
			t.Fatalf("seq %d: dead letter on %q with headers %v", seq, p.Subject, p.Header)
		}
		if len(h.recorded) != 1 || h.recorded[0].DLQSeq != 1 || h.recorded[0].StreamSeq != seq {
			t.Fatalf("seq %d: recorded %+v", seq, h.recorded)
		}
		if seq%7 == 0 { // recording failed: the message stays for the advisory's next delivery
			settled(false, false, 1, 1, 1)
			return
		}
		settled(true, true, 1, 1, 1)
	})
}
