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
	// BusySlots is how many of its slots held a tile on average since its previous
	// heartbeat (a tile finalizing behind the one rendering holds none of its own).
	BusySlots float64   `json:"busy_slots"`
	LastSeen  time.Time `json:"last_seen"`
	// Blocklisted are the jobs whose tiles this worker no longer takes, after failing them
	// repeatedly.
	Blocklisted []string `json:"blocklisted_jobs"`
	// Tags are the operator's tags of the worker (tileworker --tags); a job requiring tags
	// renders only on workers with all of them.
	Tags []string `json:"tags,omitempty"`
	// Builds are the external renderer builds the worker runs (a Blender's fingerprint); a
	// job of such a scene renders only on workers running its build.
	Builds []string `json:"builds,omitempty"`
	// Pools describe the pools whose tiles the worker pulls ("any worker" first), at most
	// MaxWorkerPools of them.
	Pools []string `json:"pools,omitempty"`
	// Starting is set while some of the worker's renderers have not yet reported their
	// builds (a Blender starting): what it can render is not known yet, so its Builds do not
	// yet rule a job out.
	Starting bool `json:"starting,omitempty"`

	// What the coordinator adds for GET /v1/workers?detail=1, never in a heartbeat: the
	// worker's busy slots at each heartbeat of the last minutes, oldest first, and its recent
	// failures, newest last.
	History        []BusySample    `json:"history,omitempty"`
	RecentFailures []WorkerFailure `json:"recent_failures,omitempty"`
}

// MaxWorkerPools bounds the pools a heartbeat lists.
const MaxWorkerPools = 16

// BusySample is a worker's busy slots (Worker.BusySlots) as one heartbeat told them.
type BusySample struct {
	Time time.Time `json:"time"`
	Busy float64   `json:"busy"`
}

// WorkerFailure is a failed attempt of a worker, as the coordinator recorded it.
type WorkerFailure struct {
	JobID        string    `json:"job_id"` // a job asking for the frame
	Frame        int       `json:"frame"`
	Tile         int       `json:"tile"`
	Class        string    `json:"class"`
	Error        string    `json:"error"`
	DeadLettered bool      `json:"dead_lettered"`
	Time         time.Time `json:"time"`
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
	// Leader is the coordinator that leads the farm, as its leadership lease says; absent while
	// none holds it (docs/design.md, "Leadership").
	Leader *Leader `json:"leader,omitempty"`
}

// Leader is the coordinator holding the farm's leadership lease.
type Leader struct {
	Address string `json:"address,omitempty"` // where clients reach its HTTP API
	ID      string `json:"id"`
	This    bool   `json:"this"` // the coordinator that answered is the leader
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
