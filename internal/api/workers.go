package api

import "time"

// WorkerInfo is a worker's heartbeat: who it is, what it renders now and how fast.
type Worker struct {
	Name             string       `json:"name"`
	Host             string       `json:"host"`
	Slots            int          `json:"slots"`
	Tiles            []WorkerTile `json:"tiles"`
	SamplesPerSecond float64      `json:"samples_per_second"`
	LastSeen         time.Time    `json:"last_seen"`
	// Blocklisted are the jobs whose tiles this worker no longer takes, after failing them
	// repeatedly.
	Blocklisted []string `json:"blocklisted_jobs"`
}

// WorkerTile is a tile a worker is rendering.
type WorkerTile struct {
	JobID        string `json:"job_id"`
	Frame        int    `json:"frame"`
	TileKey      string `json:"tile_key"`
	SamplesDone  int    `json:"samples_done"`
	SamplesTotal int    `json:"samples_total"`
}

// WorkersResponse is the body of GET /v1/workers.
type WorkersResponse struct {
	Workers []Worker `json:"workers"`
}
