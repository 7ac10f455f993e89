package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
	"github.com/tilefarm/tilefarm/tiles"
)

// coreSubject carries the core-NATS baseline; no farm stream captures it.
const coreSubject = "bench.core"

// fetchWait is how long one FetchTile may wait before a missing message counts as lost.
const fetchWait = 5 * time.Second

// dispatchResult sums the timings of one dispatch measurement of n messages.
type dispatchResult struct {
	n       int
	publish time.Duration // n JetStream publishes with msg ids, each waiting for its PubAck
	consume time.Duration // n FetchTile + DoubleAck, one at a time as a worker slot does
	core    time.Duration // n core-NATS publishes delivered to a subscriber: the baseline
}

func (d dispatchResult) add(o dispatchResult) dispatchResult {
	return dispatchResult{n: d.n + o.n, publish: d.publish + o.publish, consume: d.consume + o.consume, core: d.core + o.core}
}

// outboxMessage is one outbox record as the coordinator writes it: a tile job keyed by tile_key.
type outboxMessage struct {
	id   string
	data []byte
}

// outboxMessages builds n realistic tile jobs: 192x108 frames in 16 px tiles, frame after frame.
func outboxMessages(n int) ([]outboxMessage, error) {
	st := render.Settings{Camera: "orbit", Width: 192, Height: 108, SPP: 16, MaxDepth: 6, Seed: 7}
	rects, err := tiles.Split(st.Width, st.Height, 16)
	if err != nil {
		return nil, fmt.Errorf("splitting benchmark frame: %w", err)
	}
	sv := identity.SceneVersion([]byte("dispatch benchmark scene"), "", nil)
	sh := identity.SettingsHash(st)
	out := make([]outboxMessage, 0, n)
	for frame := 1; len(out) < n; frame++ {
		fk := identity.FrameKey(sv, st.Camera, frame, sh)
		for _, r := range rects {
			if len(out) == n {
				break
			}
			tk := identity.TileKey(fk, r)
			data, err := json.Marshal(wire.TileJob{JobID: "bench", TileKey: tk, FrameKey: fk, SceneVersion: sv,
				Settings: st, Frame: frame, Rect: r, InputHash: identity.InputHash(sv, st, frame, r)})
			if err != nil {
				return nil, err
			}
			out = append(out, outboxMessage{id: tk, data: data})
		}
	}
	return out, nil
}

// measureDispatch starts an embedded JetStream server in a fresh directory under base, sets up
// the farm's streams, and times n messages through core NATS (baseline), then through
// queue.Queue.Publish with msg ids, then out again with FetchTile + DoubleAck. It checks that the
// dedup window catches a republished id and that every message comes out exactly once.
func measureDispatch(ctx context.Context, base string, n int) (dispatchResult, error) {
	msgs, err := outboxMessages(n)
	if err != nil {
		return dispatchResult{}, err
	}
	dir, err := os.MkdirTemp(base, "dispatch-*")
	if err != nil {
		return dispatchResult{}, fmt.Errorf("creating server dir: %w", err)
	}
	defer os.RemoveAll(dir)
	emb, err := queue.StartEmbedded(ctx, filepath.Join(dir, "jetstream"), "")
	if err != nil {
		return dispatchResult{}, err
	}
	defer emb.Shutdown()
	nc, err := emb.Connect("tilefarm-bench")
	if err != nil {
		return dispatchResult{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return dispatchResult{}, fmt.Errorf("opening JetStream: %w", err)
	}
	f, err := queue.Setup(ctx, js, queue.DefaultConfig())
	if err != nil {
		return dispatchResult{}, err
	}
	f.Log = quietLogger()

	res := dispatchResult{n: n}
	if res.core, err = corePublish(ctx, nc, msgs); err != nil {
		return dispatchResult{}, err
	}

	start := time.Now()
	for _, m := range msgs {
		dup, err := f.Publish(ctx, queue.SubjectRender, m.id, m.data, nil)
		if err != nil {
			return dispatchResult{}, err
		}
		if dup {
			return dispatchResult{}, fmt.Errorf("first publish of %s reported a duplicate", m.id)
		}
	}
	res.publish = time.Since(start)
	if dup, err := f.Publish(ctx, queue.SubjectRender, msgs[0].id, msgs[0].data, nil); err != nil {
		return dispatchResult{}, err
	} else if !dup {
		return dispatchResult{}, fmt.Errorf("republishing %s was not deduplicated", msgs[0].id)
	}

	seen := make(map[string]bool, n)
	start = time.Now()
	src := f.Sources(queue.Capabilities{})
	for len(seen) < n {
		msg, err := src.FetchTile(ctx, fetchWait)
		if err != nil {
			return dispatchResult{}, err
		}
		if msg == nil {
			return dispatchResult{}, fmt.Errorf("only %d of %d messages delivered within %v", len(seen), n, fetchWait)
		}
		id := msg.Headers().Get(nats.MsgIdHdr)
		if seen[id] {
			return dispatchResult{}, fmt.Errorf("message %s delivered twice", id)
		}
		seen[id] = true
		if err := msg.DoubleAck(ctx); err != nil {
			return dispatchResult{}, fmt.Errorf("acking %s: %w", id, err)
		}
	}
	res.consume = time.Since(start)
	return res, nil
}

// corePublish is the baseline: the same payloads published on core NATS (no persistence, no
// acks) until a subscriber on the same connection has received all of them.
func corePublish(ctx context.Context, nc *nats.Conn, msgs []outboxMessage) (time.Duration, error) {
	var got atomic.Int64
	all := make(chan struct{})
	want := int64(len(msgs))
	sub, err := nc.Subscribe(coreSubject, func(*nats.Msg) {
		if got.Add(1) == want {
			close(all)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("subscribing to %s: %w", coreSubject, err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return 0, fmt.Errorf("lifting pending limits: %w", err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return 0, fmt.Errorf("flushing subscription: %w", err)
	}
	start := time.Now()
	for _, m := range msgs {
		if err := nc.Publish(coreSubject, m.data); err != nil {
			return 0, fmt.Errorf("publishing on %s: %w", coreSubject, err)
		}
	}
	select {
	case <-all:
	case <-ctx.Done():
		return 0, fmt.Errorf("core baseline: %d of %d messages received: %w", got.Load(), want, ctx.Err())
	}
	return time.Since(start), nil
}

// reportDispatch reports message rates and how the full farm dispatch (publish with dedup id +
// PubAck, then fetch + ack) compares with bare core-NATS delivery of the same payloads.
func reportDispatch(r reporter, d dispatchResult) {
	r.ReportMetric(rate(d.n, d.publish), "publish-msgs/s")
	r.ReportMetric(rate(d.n, d.consume), "fetch-ack-msgs/s")
	r.ReportMetric(rate(d.n, d.publish+d.consume), "msgs/s")
	r.ReportMetric(rate(d.n, d.core), "core-msgs/s")
	r.ReportMetric(ratio(d.core, d.publish+d.consume), "dispatch/core")
	r.ReportMetric(ratio(d.core, d.publish), "publish/core")
}
