package fleet

import (
	"context"
	"log/slog"

	"github.com/tilefarm/tilefarm/internal/node"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/internal/scene"
	"github.com/tilefarm/tilefarm/internal/scene/jsonscene"
)

// CoordinatorConfig is the fleet's coordinator process: `coordinator serve --workers 0` on an
// external NATS, with the fleet's kind registered beside the JSON scene's.
type CoordinatorConfig struct {
	NATS     string // the servers' URLs, comma-separated
	Store    string // the object store's URL
	Data     string // the coordinator database
	Listen   string // HTTP API and /metrics
	Debug    string // /debug/pprof/, "" for none
	Replicas int    // of every stream and bucket: 3 on a cluster of three
	Log      *slog.Logger
	// Ready is called, if set, once the coordinator accepts submissions, with its API address.
	Ready func(addr string)
}

// RunCoordinator runs the coordinator (node.StartCoordinator, as serve runs it) until ctx is
// done.
func RunCoordinator(ctx context.Context, c CoordinatorConfig) error {
	qcfg := queue.DefaultConfig()
	qcfg.Replicas = max(c.Replicas, 1)
	n, err := node.StartCoordinator(ctx, node.CoordinatorOptions{DataDir: c.Data, NATS: node.NATSClient{URLs: c.NATS},
		StoreURL: c.Store, HTTPListen: c.Listen, DebugListen: c.Debug, Queue: qcfg,
		Kinds: scene.Kinds{Kind{}, jsonscene.Kind{}}, Log: c.Log})
	if err != nil {
		return err
	}
	defer n.Close()
	if c.Ready != nil {
		c.Ready(n.HTTPAddr)
	}
	<-ctx.Done()
	return nil
}
