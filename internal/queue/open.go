package queue

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// Open binds to a farm the coordinator has already set up, without changing any of it, and
// reads the settings (ack-wait, MaxDeliver, lease TTL) from the server. Workers use it so that
// one operator setting on the coordinator governs the whole farm.
func Open(ctx context.Context, js jetstream.JetStream) (*Queue, error) {
	tiles, err := js.Stream(ctx, StreamTiles)
	if err != nil {
		return nil, fmt.Errorf("binding to stream %s (is the coordinator running?): %w", StreamTiles, err)
	}
	events, err := js.Stream(ctx, StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("binding to stream %s: %w", StreamEvents, err)
	}
	dlq, err := js.Stream(ctx, StreamDLQ)
	if err != nil {
		return nil, fmt.Errorf("binding to stream %s: %w", StreamDLQ, err)
	}
	var bands [NumBands]jetstream.Consumer
	for b := range NumBands {
		if bands[b], err = tiles.Consumer(ctx, b.Consumer()); err != nil {
			return nil, fmt.Errorf("binding to consumer %s/%s: %w", StreamTiles, b.Consumer(), err)
		}
	}
	cons := bands[BandNormal]
	assemblers, err := tiles.Consumer(ctx, ConsumerAssemblers)
	if err != nil {
		return nil, fmt.Errorf("binding to consumer %s/%s: %w", StreamTiles, ConsumerAssemblers, err)
	}
	kv, err := js.KeyValue(ctx, BucketLeases)
	if err != nil {
		return nil, fmt.Errorf("binding to bucket %s: %w", BucketLeases, err)
	}
	kvStatus, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading bucket %s: %w", BucketLeases, err)
	}
	fkv, err := js.KeyValue(ctx, BucketFailures)
	if err != nil {
		return nil, fmt.Errorf("binding to bucket %s: %w", BucketFailures, err)
	}
	cc := cons.CachedInfo().Config
	sc := tiles.CachedInfo().Config
	cfg := DefaultConfig()
	cfg.AckWait, cfg.Backoff = cc.AckWait, cc.BackOff
	if n, err := strconv.Atoi(cc.Metadata[MetaMaxFailures]); err == nil {
		cfg.MaxFailures = n
	}
	if n, err := strconv.Atoi(cc.Metadata[MetaMaxDeliver]); err == nil {
		cfg.MaxDeliver = n
	}
	cfg.DedupWindow, cfg.Replicas, cfg.LeaseTTL = sc.Duplicates, sc.Replicas, kvStatus.TTL()
	if err := cfg.Validate(); err != nil {
		// A bucket without a TTL would make a crashed worker's leases immortal.
		return nil, fmt.Errorf("the farm on this server is misconfigured: %w", err)
	}
	dropped, workers, err := openDirectory(ctx, js)
	if err != nil {
		return nil, err
	}
	return &Queue{
		Dropped: dropped, Workers: workers,
		JS: js, Tiles: tiles, Events: events, DLQ: dlq, Bands: bands, Assemblers: assemblers,
		Leases: &Leases{kv: kv, ttl: cfg.LeaseTTL}, Failures: &Failures{kv: fkv}, Cfg: cfg, Log: slog.Default(),
	}, nil
}
