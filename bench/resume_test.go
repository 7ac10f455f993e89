package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/tilefarm/tilefarm/checkpoint"
	"github.com/tilefarm/tilefarm/identity"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/render"
)

// resumeWorkload is one tile rendered fresh and resumed from a half-way checkpoint.
type resumeWorkload struct {
	width, height, spp int // frame settings; spp is the tile's full sample count
	frame              int
	tileSize           int // the tile is a tileSize square at the frame's centre
	reps               int // fresh/resumed pairs per measurement
	codecReps          int // checkpoint encodes and decodes per measurement
}

// resumeResult sums the timings of one measurement.
type resumeResult struct {
	fresh, resumed   time.Duration // full render vs decode + import + second half
	encode, decode   time.Duration // codecReps checkpoint encodes / decodes of a full tile state
	rawBytes         int64         // float64 accumulator bytes pushed through the codec
	encodedBytes     int64         // their encoded size
	samplesRecovered int           // samples the resumed renders did not redo
}

func (r resumeResult) add(o resumeResult) resumeResult {
	return resumeResult{fresh: r.fresh + o.fresh, resumed: r.resumed + o.resumed, encode: r.encode + o.encode,
		decode: r.decode + o.decode, rawBytes: r.rawBytes + o.rawBytes, encodedBytes: r.encodedBytes + o.encodedBytes,
		samplesRecovered: r.samplesRecovered + o.samplesRecovered}
}

// tileJob describes the workload's tile with its real identities, as a worker would get it.
func (w resumeWorkload) tileJob(bundle *bundle.Bundle, scene *render.Scene) (wire.TileJob, error) {
	st := scene.Defaults()
	st.Width, st.Height, st.SPP = w.width, w.height, w.spp
	if err := scene.Validate(st); err != nil {
		return wire.TileJob{}, fmt.Errorf("resume benchmark settings: %w", err)
	}
	x0, y0 := (w.width-w.tileSize)/2, (w.height-w.tileSize)/2
	r := render.Rect{X0: x0, Y0: y0, X1: x0 + w.tileSize, Y1: y0 + w.tileSize}
	sv := bundle.Version()
	fk := identity.FrameKey(sv, st.Camera, w.frame, identity.SettingsHash(st))
	return wire.TileJob{TileKey: identity.TileKey(fk, r), FrameKey: fk, SceneVersion: sv, Settings: st,
		Frame: w.frame, Rect: r, InputHash: identity.InputHash(sv, st, w.frame, r)}, nil
}

// measureResume renders the workload's tile to half its samples and checkpoints it through
// checkpoint.Codec (untimed), then times reps pairs of a fresh full render against a resume (decode
// the checkpoint, import it, render the second half), alternating which goes first. Every
// resumed tile must equal the fresh one bit for bit. Finally it times codecReps encodes and
// decodes of the full tile state.
func measureResume(ctx context.Context, bundle *bundle.Bundle, w resumeWorkload) (resumeResult, error) {
	scene, err := render.ParseScene(bundle.Scene, bundle.Assets(ctx, 0))
	if err != nil {
		return resumeResult{}, fmt.Errorf("parsing scene: %w", err)
	}
	job, err := w.tileJob(bundle, scene)
	if err != nil {
		return resumeResult{}, err
	}
	codec, err := checkpoint.NewCodec()
	if err != nil {
		return resumeResult{}, err
	}
	defer codec.Close()

	half, err := render.NewTile(scene, job.Settings, job.Frame, job.Rect)
	if err != nil {
		return resumeResult{}, fmt.Errorf("creating tile: %w", err)
	}
	if err := half.Render(ctx, 0, w.spp/2); err != nil {
		return resumeResult{}, fmt.Errorf("rendering first half: %w", err)
	}
	hs := half.Export()
	ckpt, err := codec.Encode(checkpoint.Checkpoint{TileKey: job.TileKey, InputHash: job.InputHash, Next: hs.Next,
		Sum: hs.Sum, Attempt: "bench", SavedAt: time.Now().UTC()})
	if err != nil {
		return resumeResult{}, fmt.Errorf("encoding half-way checkpoint: %w", err)
	}

	var res resumeResult
	var full render.State
	for i := range w.reps {
		fresh := func() error {
			start := time.Now()
			t, err := render.NewTile(scene, job.Settings, job.Frame, job.Rect)
			if err == nil {
				err = t.Render(ctx, 0, w.spp)
			}
			res.fresh += time.Since(start)
			if err != nil {
				return fmt.Errorf("fresh render: %w", err)
			}
			full = t.Export()
			return nil
		}
		var resumed render.State
		resume := func() error {
			start := time.Now()
			t, err := resumeTile(ctx, codec, ckpt, scene, job)
			res.resumed += time.Since(start)
			if err != nil {
				return err
			}
			res.samplesRecovered += hs.Next
			resumed = t.Export()
			return nil
		}
		order := []func() error{fresh, resume}
		if i%2 == 1 {
			order[0], order[1] = resume, fresh
		}
		for _, step := range order {
			if err := step(); err != nil {
				return resumeResult{}, err
			}
		}
		if err := sameState(resumed, full); err != nil {
			return resumeResult{}, err
		}
	}

	fullCkpt := checkpoint.Checkpoint{TileKey: job.TileKey, InputHash: job.InputHash, Next: full.Next, Sum: full.Sum,
		Attempt: "bench", SavedAt: time.Now().UTC()}
	var data []byte
	start := time.Now()
	for range w.codecReps {
		if data, err = codec.Encode(fullCkpt); err != nil {
			return resumeResult{}, fmt.Errorf("encoding checkpoint: %w", err)
		}
	}
	res.encode = time.Since(start)
	start = time.Now()
	var back checkpoint.Checkpoint
	for range w.codecReps {
		if back, err = codec.Decode(data); err != nil {
			return resumeResult{}, fmt.Errorf("decoding checkpoint: %w", err)
		}
	}
	res.decode = time.Since(start)
	if err := sameState(render.State{Next: back.Next, Sum: back.Sum}, full); err != nil {
		return resumeResult{}, fmt.Errorf("checkpoint round trip: %w", err)
	}
	res.rawBytes = int64(w.codecReps) * int64(8*len(full.Sum))
	res.encodedBytes = int64(w.codecReps) * int64(len(data))
	return res, nil
}

// resumeTile is the worker's resume path: decode the checkpoint, validate it against the tile's
// identities, import it and render the remaining samples.
func resumeTile(ctx context.Context, codec *checkpoint.Codec, ckpt []byte, scene *render.Scene, job wire.TileJob) (*render.Tile, error) {
	c, err := codec.Decode(ckpt)
	if err != nil {
		return nil, fmt.Errorf("decoding checkpoint: %w", err)
	}
	if !c.Matches(job.TileKey, job.InputHash) {
		return nil, fmt.Errorf("checkpoint of %s does not match tile %s", c.TileKey, job.TileKey)
	}
	t, err := render.NewTile(scene, job.Settings, job.Frame, job.Rect)
	if err != nil {
		return nil, fmt.Errorf("creating tile: %w", err)
	}
	if err := t.Import(render.State{Next: c.Next, Sum: c.Sum}); err != nil {
		return nil, fmt.Errorf("importing checkpoint: %w", err)
	}
	if err := t.Render(ctx, t.Next(), job.Settings.SPP); err != nil {
		return nil, fmt.Errorf("rendering second half: %w", err)
	}
	return t, nil
}

// sameState compares tile states bit for bit, the guarantee resume rests on.
func sameState(got, want render.State) error {
	if got.Next != want.Next || len(got.Sum) != len(want.Sum) {
		return fmt.Errorf("%w: state at sample %d with %d sums, want %d with %d", errMismatch, got.Next, len(got.Sum), want.Next, len(want.Sum))
	}
	for i := range got.Sum {
		if math.Float64bits(got.Sum[i]) != math.Float64bits(want.Sum[i]) {
			return fmt.Errorf("%w: accumulator %d is %v, want %v", errMismatch, i, got.Sum[i], want.Sum[i])
		}
	}
	return nil
}

// reportResume reports the resume/fresh time ratio (about 1 - recovered fraction, so ~0.5 from
// a half-way checkpoint), the fraction of samples recovered for comparison, and the checkpoint
// codec's throughput in MB/s of raw float64 accumulators.
func reportResume(r reporter, res resumeResult, spp, reps int) {
	r.ReportMetric(ratio(res.resumed, res.fresh), "resume/fresh")
	r.ReportMetric(1-float64(res.samplesRecovered)/float64(spp*reps), "expected-resume/fresh")
	r.ReportMetric(float64(res.rawBytes)/1e6/res.encode.Seconds(), "ckpt-encode-MB/s")
	r.ReportMetric(float64(res.rawBytes)/1e6/res.decode.Seconds(), "ckpt-decode-MB/s")
	r.ReportMetric(float64(res.encodedBytes)/float64(res.rawBytes), "ckpt-size/raw")
}
