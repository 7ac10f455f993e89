package api

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

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
	// Tags are the operator's tags of the worker (tileworker --tags); a job requiring tags
	// renders only on workers with all of them.
	Tags []string `json:"tags,omitempty"`
	// Builds are the external renderer builds the worker runs (a Blender's fingerprint); a
	// job of such a scene renders only on workers running its build.
	Builds []string `json:"builds,omitempty"`
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

// MaxTags is how many tags a worker may carry or a job require.
const MaxTags = 16

var tagPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,31}$`)

// Tags checks tags (a worker's or a job's requirements) and returns them sorted, without
// repeats: lowercase letters, digits, '_', '.' and '-', at most 32 characters each, at most
// MaxTags of them.
func Tags(tags []string) ([]string, error) {
	var out []string
	for _, t := range tags {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if !tagPattern.MatchString(t) {
			return nil, fmt.Errorf("tag %q: want lowercase letters, digits, '_', '.' or '-', at most 32 characters", t)
		}
		out = append(out, t)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > MaxTags {
		return nil, fmt.Errorf("%d tags: at most %d", len(out), MaxTags)
	}
	return out, nil
}
