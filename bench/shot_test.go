package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/coordinator"
	"github.com/tilefarm/tilefarm/internal/farm"
	"github.com/tilefarm/tilefarm/internal/queue"
	"github.com/tilefarm/tilefarm/tiles"
)

// dispatchShot is a shot submitted to `coordinator serve --workers 0`: nothing renders, so what
// is measured is the coordinator alone taking the job and making its tiles durable.
type dispatchShot struct {
	frames, width, height, tileSize int
	sync                            string // --nats-sync
}

// shotDispatch is what one shot submission cost.
type shotDispatch struct {
	tiles              int
	submitOne, submitN time.Duration // one frame, then frames frames
	durable            time.Duration // from the big submission to its last tile stored in TILES
	peakRSS            int64         // bytes, VmHWM of the coordinator process
	dbBytes            int64         // coordinator.db after everything is durable
	applied            time.Duration // from the first tile.completed event published to the job's last tile recorded
	dbBytesDone        int64         // coordinator.db once every tile is recorded completed
}

// oneFrameSubmits is how many one-frame submissions the median is taken over.
const oneFrameSubmits = 5

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// coordinatorBinary builds cmd/coordinator once per test binary.
func coordinatorBinary() (string, error) {
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "tilefarm-bench-bin")
		if binErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir, "./cmd/coordinator")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("building coordinator: %v\n%s", err, out)
		}
	})
	return filepath.Join(binDir, "coordinator"), binErr
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// measureShotDispatch starts a coordinator process in dir, submits frame 1 alone, then w.frames
// other frames, and measures how long each submission takes to be accepted and how fast the
// big one's tiles become durable in TILES, with the process's peak memory and database size.
func measureShotDispatch(ctx context.Context, dir string, bundle *farm.Bundle, w dispatchShot) (shotDispatch, error) {
	var res shotDispatch
	natsAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	srv, err := startCoordinatorProcess(ctx, dir, "--nats-listen", natsAddr, "--nats-sync", w.sync)
	if err != nil {
		return res, err
	}
	defer srv.stop()
	data, httpAddr := srv.data, srv.http
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		return res, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return res, err
	}
	c := client.New(httpAddr, "")
	if err := c.PutScene(ctx, bundle.Version(), bundle); err != nil {
		return res, fmt.Errorf("uploading scene: %w", err)
	}
	// One-frame submissions are a couple of milliseconds, so take the median of a few.
	req := coordinator.SubmitRequest{SceneVersion: bundle.Version(), Width: w.width, Height: w.height,
		TileSize: w.tileSize, Formats: []string{"png"}}
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
	res.submitOne = ones[len(ones)/2]
	perFrame *= oneFrameSubmits
	req.First, req.Last = oneFrameSubmits+1, oneFrameSubmits+w.frames
	start := time.Now()
	big, err := c.Submit(ctx, bundle, req)
	if err != nil {
		return res, fmt.Errorf("submitting %d frames: %w", w.frames, err)
	}
	res.submitN = time.Since(start)
	res.tiles = big.Status.TilesTotal
	if err := waitDurable(ctx, js, uint64(perFrame+res.tiles)); err != nil {
		return res, err
	}
	res.durable = time.Since(start)
	if res.peakRSS, err = peakRSS(srv.pid()); err != nil {
		return res, err
	}
	fi, err := os.Stat(filepath.Join(data, "coordinator.db"))
	if err != nil {
		return res, err
	}
	res.dbBytes = fi.Size()

	// Then every tile reports completion, as workers would: the coordinator applies 122,400
	// events and its tile tables fill in.
	start = time.Now()
	if err := publishCompletions(ctx, js, big.Status, w); err != nil {
		return res, err
	}
	for {
		st, err := c.Status(ctx, big.Status.JobID)
		if err != nil {
			return res, err
		}
		if st.TilesCompleted == st.TilesTotal {
			break
		}
		if !queue.Sleep(ctx, 50*time.Millisecond) {
			return res, fmt.Errorf("waiting for %d tile events to be applied (%d so far): %w", st.TilesTotal, st.TilesCompleted, ctx.Err())
		}
	}
	res.applied = time.Since(start)
	if res.peakRSS, err = peakRSS(srv.pid()); err != nil {
		return res, err
	}
	if fi, err = os.Stat(filepath.Join(data, "coordinator.db")); err != nil {
		return res, err
	}
	res.dbBytesDone = fi.Size()
	return res, nil
}

// publishCompletions publishes tile.completed for every tile of a job, asynchronously.
func publishCompletions(ctx context.Context, js jetstream.JetStream, st coordinator.Status, w dispatchShot) error {
	for _, fr := range st.Frames {
		ft, err := tiles.FrameTiles(fr.FrameKey, w.width, w.height, w.tileSize)
		if err != nil {
			return err
		}
		for i, t := range ft {
			ev := farm.Event{ID: farm.EventTileCompleted + ":" + t.Key, Type: farm.EventTileCompleted, JobID: st.JobID,
				TileKey: t.Key, TileIndex: i, FrameKey: fr.FrameKey, Seq: 1, Delivery: 1, Worker: "bench", Time: time.Now().UTC()}
			data, err := json.Marshal(ev)
			if err != nil {
				return err
			}
			if _, err := js.PublishAsync(ev.Subject(), data, jetstream.WithStallWait(time.Minute)); err != nil {
				return err
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

// coordinatorProcess is a `coordinator serve --workers 0` process with its data in a directory.
type coordinatorProcess struct {
	cmd        *exec.Cmd
	data, http string
}

// startCoordinatorProcess starts `coordinator serve --workers 0` with its data under dir and
// its log in dir/serve.log, and waits until it is healthy.
func startCoordinatorProcess(ctx context.Context, dir string, extra ...string) (*coordinatorProcess, error) {
	bin, err := coordinatorBinary()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p := &coordinatorProcess{data: filepath.Join(dir, "data"), http: httpAddr}
	args := append([]string{"serve", "--data", p.data, "--listen", httpAddr, "--workers", "0", "--log-level", "warn"}, extra...)
	p.cmd = exec.CommandContext(ctx, bin, args...)
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, httpAddr); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *coordinatorProcess) pid() int { return p.cmd.Process.Pid }

func (p *coordinatorProcess) stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

func waitHealthy(ctx context.Context, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !queue.Sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	return errors.New("coordinator did not become healthy")
}

// waitDurable waits until TILES holds n messages.
func waitDurable(ctx context.Context, js jetstream.JetStream, n uint64) error {
	s, err := js.Stream(ctx, queue.StreamTiles)
	if err != nil {
		return err
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

// peakRSS reads a process's peak resident set (VmHWM) from /proc.
func peakRSS(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

func reportShot(r reporter, d shotDispatch, prefix string) {
	r.ReportMetric(d.submitN.Seconds(), prefix+"submit-s")
	r.ReportMetric(d.submitOne.Seconds(), prefix+"submit1-s")
	r.ReportMetric(ratio(d.submitN, d.submitOne), prefix+"submitN/submit1")
	r.ReportMetric(rate(d.tiles, d.durable), prefix+"durable-tiles/s")
	r.ReportMetric(float64(d.peakRSS)/(1<<20), prefix+"peak-rss-MB")
	r.ReportMetric(float64(d.dbBytes)/float64(d.tiles), prefix+"db-bytes/tile")
	r.ReportMetric(float64(d.dbBytesDone)/float64(d.tiles), prefix+"done-db-bytes/tile")
	r.ReportMetric(rate(d.tiles, d.applied), prefix+"events/s")
}

// BenchmarkShotDispatch: a 240-frame 1920x1080 shot in 64 px tiles (122,400 tiles) submitted
// to a coordinator process with no workers, with the embedded JetStream syncing every second
// (the default) and on every write.
func BenchmarkShotDispatch(b *testing.B) {
	bundle := loadBundle(b, "shot")
	for _, sync := range []string{string(queue.DefaultSync), string(queue.SyncAlways)} {
		b.Run("sync="+sync, func(b *testing.B) {
			for range b.N {
				d, err := measureShotDispatch(b.Context(), b.TempDir(), bundle, dispatchShot{frames: 240, width: 1920, height: 1080, tileSize: 64, sync: sync})
				if err != nil {
					b.Fatal(err)
				}
				reportShot(b, d, "")
			}
		})
	}
}
