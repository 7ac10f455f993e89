package coordinator

import (
	"context"
	"fmt"
	"time"

	"github.com/tilefarm/tilefarm/internal/metrics"
)

// relay publishes outbox records in order, each with its dedup id, and deletes a record only
// after its PubAck. A crash between the two republishes; JetStream's dedup window (or, past it,
// the worker's manifest check) absorbs the repeat.
func (c *Coordinator) relay(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		recs, err := c.store.PendingOutbox(ctx, 256)
		if err != nil {
			return fmt.Errorf("reading outbox: %w", err)
		}
		for _, r := range recs {
			if c.cfg.Faults.CrashBeforePublish && c.cfg.Faults.Crash != nil {
				c.cfg.Faults.Crash("outbox-before-publish")
			}
			dup, err := c.farm.Publish(ctx, r.Subject, r.MsgID, r.Data, nil)
			if err != nil {
				return fmt.Errorf("publishing outbox record %d (%s): %w", r.Seq, r.MsgID, err)
			}
			if dup {
				c.m.DuplicatesSuppressed.WithLabelValues(metrics.LayerPublishDedup).Inc()
				c.log.Info("publish deduplicated by JetStream", "msg_id", r.MsgID)
			}
			if c.cfg.Faults.CrashAfterPublish && c.cfg.Faults.Crash != nil {
				c.cfg.Faults.Crash("outbox-after-publish")
			}
			if err := c.store.DeleteOutbox(ctx, r.Seq); err != nil {
				return fmt.Errorf("deleting outbox record %d: %w", r.Seq, err)
			}
		}
		if len(recs) == 256 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.relayKick:
		case <-t.C:
		}
	}
}
