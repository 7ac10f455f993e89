package farmbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/tiles"
)

// DispatchShot is a shot submitted to `coordinator serve --workers 0`: nothing renders, so what
// is measured is the coordinator alone taking the job and making its tiles durable.
type DispatchShot struct {
	Frames, Width, Height, TileSize int
	Sync                            string // --nats-sync
}

// ShotDispatch is what one shot submission cost.
type ShotDispatch struct {
	Tiles              int
	SubmitOne, SubmitN time.Duration // one frame, then Frames frames
	Durable            time.Duration // from the big submission to its last tile stored in TILES
	PeakRSS            int64         // bytes, VmHWM of the coordinator process
	DBBytes            int64         // coordinator.db after everything is durable
	Applied            time.Duration // from the first tile.completed event published to the job's last tile recorded
	DBBytesDone        int64         // coordinator.db once every tile is recorded completed
}

// oneFrameSubmits is how many one-frame submissions the median is taken over.
const oneFrameSubmits = 5

// MeasureShotDispatch starts a coordinator process (StartCoordinator) in dir, submits five one-frame
// jobs, then w.Frames other frames, and measures how long each submission takes to be accepted
// and how fast the big one's tiles become durable in TILES, with the process's peak memory and
// database size; then it publishes a tile.completed event for every tile, as workers would, and
// measures how fast the coordinator applies them.
func MeasureShotDispatch(ctx context.Context, bins farmtest.Binaries, dir string, bundle *bundle.Bundle, w DispatchShot) (ShotDispatch, error) {
	var res ShotDispatch
	srv, err := StartCoordinator(ctx, bins, dir, "--nats-sync", w.Sync)
	if err != nil {
		return res, err
	}
	defer srv.Close()
	nc, err := nats.Connect(srv.NATSURL())
	if err != nil {
		return res, fmt.Errorf("connecting to the coordinator's jetstream: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return res, err
	}
	c := client.New(srv.HTTP, "")
	if _, err := client.UploadScene(ctx, c, bundle, 0, nil); err != nil {
		return res, fmt.Errorf("uploading scene: %w", err)
	}
	// One-frame submissions are a couple of milliseconds, so take the median of a few.
	req := api.SubmitRequest{SceneVersion: bundle.Version(), Width: w.Width, Height: w.Height,
		TileSize: w.TileSize, Formats: []string{"png"}, NoMovie: true} // dispatch is measured, not the preview movie
	var ones []time.Duration
	perFrame := 0
	for n := 1; n <= oneFrameSubmits; n++ {
		req.First, req.Last = n, n
		start := time.Now()
		one, err := c.Submit(ctx, bundle, req)
		if err != nil {
			return res, fmt.Errorf("submitting one frame: %w", err)
		}
		ones = append(ones, time.Since(start))
		perFrame = one.Status.TilesTotal
		if err := waitDurable(ctx, js, uint64(n*perFrame)); err != nil {
			return res, err
		}
	}
	slices.Sort(ones)
	res.SubmitOne = ones[len(ones)/2]
	perFrame *= oneFrameSubmits
	req.First, req.Last = oneFrameSubmits+1, oneFrameSubmits+w.Frames
	start := time.Now()
	big, err := c.Submit(ctx, bundle, req)
	if err != nil {
		return res, fmt.Errorf("submitting %d frames: %w", w.Frames, err)
	}
	res.SubmitN = time.Since(start)
	res.Tiles = big.Status.TilesTotal
	if err := waitDurable(ctx, js, uint64(perFrame+res.Tiles)); err != nil {
		return res, err
	}
	res.Durable = time.Since(start)
	if res.PeakRSS, err = PeakRSS(srv.Coord.Pid()); err != nil {
		return res, err
	}
	dbPath := filepath.Join(srv.Data, "coordinator.db")
	fi, err := os.Stat(dbPath)
	if err != nil {
		return res, err
	}
	res.DBBytes = fi.Size()

	// Then every tile reports completion, as workers would: the coordinator applies an event
	// per tile and its tile tables fill in. (No manifest backs these completions: a frame's
	// assembly would find them unproven and send its tiles back, so what is timed is the events
	// applied, the coordinator's consumer acking the last of them.)
	start = time.Now()
	if err := publishCompletions(ctx, js, big.Status, w); err != nil {
		return res, err
	}
	events, err := js.Stream(ctx, queue.StreamEvents)
	if err != nil {
		return res, err
	}
	last := events.CachedInfo().State.LastSeq
	if info, err := events.Info(ctx); err == nil {
		last = info.State.LastSeq
	}
	for {
		cons, err := js.Consumer(ctx, queue.StreamEvents, coordinator.ConsumerEvents)
		if err != nil {
			return res, err
		}
		info := cons.CachedInfo()
		if info.AckFloor.Stream >= last && info.NumAckPending == 0 {
			break
		}
		if !queue.Sleep(ctx, 50*time.Millisecond) {
			return res, fmt.Errorf("waiting for %d tile events to be applied (acked up to %d of %d): %w", res.Tiles, info.AckFloor.Stream, last, ctx.Err())
		}
	}
	res.Applied = time.Since(start)
	if res.PeakRSS, err = PeakRSS(srv.Coord.Pid()); err != nil {
		return res, err
	}
	if fi, err = os.Stat(dbPath); err != nil {
		return res, err
	}
	res.DBBytesDone = fi.Size()
	return res, nil
}

// publishCompletions publishes tile.completed for every tile of a job, asynchronously.
func publishCompletions(ctx context.Context, js jetstream.JetStream, st api.Status, w DispatchShot) error {
	for _, fr := range st.Frames {
		ft, err := tiles.FrameTiles(fr.FrameKey, w.Width, w.Height, w.TileSize)
		if err != nil {
			return err
		}
		for i, t := range ft {
			ev := wire.Event{ID: wire.EventTileCompleted + ":" + t.Key, Type: wire.EventTileCompleted, JobID: st.JobID,
				TileKey: t.Key, TileIndex: i, FrameKey: fr.FrameKey, Seq: 1, Delivery: 1, Worker: "bench", Time: time.Now().UTC()}
			data, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			if _, err := js.PublishAsync(ev.Subject(), data, jetstream.WithStallWait(time.Minute)); err != nil {
				return fmt.Errorf("publishing a tile event: %w", err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitDurable waits until TILES holds n messages.
func waitDurable(ctx context.Context, js jetstream.JetStream, n uint64) error {
	s, err := js.Stream(ctx, queue.StreamTiles)
	if err != nil {
		return fmt.Errorf("opening the tiles stream: %w", err)
	}
	for {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs >= n {
			return nil
		}
		if !queue.Sleep(ctx, 20*time.Millisecond) {
			return fmt.Errorf("waiting for %d durable tiles, have %d: %w", n, info.State.Msgs, ctx.Err())
		}
	}
}
