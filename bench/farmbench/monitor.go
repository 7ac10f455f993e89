package farmbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/proctest"
	"github.com/tilefarm/tilefarm/internal/wire"
	"github.com/tilefarm/tilefarm/tiles"
)

// MonitorLoad is a coordinator watched by the web monitor (docs/web.md, "Live and light"):
// Jobs jobs of Frames frames each submitted to `coordinator serve --workers 0`, and tile events
// published at Rate a second as workers would send them (nothing renders: what is measured is
// the coordinator alone), job after job, frame after frame, every tile of a frame but its
// last, so no frame asks for an assembly. The coordinator's CPU is read over Window with no
// browser, then with the monitor's jobs view open in headless Chromium, then with the page of
// the job being rendered open (its contact sheet and chart), Rounds times in turn.
type MonitorLoad struct {
	Jobs, Frames, Width, Height, TileSize int
	Rate                                  int // tile.completed events a second
	Window                                time.Duration
	Rounds                                int
	// ProfileDir, if set, receives a CPU profile of the coordinator over each window of the
	// first round: monitor-none.pprof, monitor-jobs.pprof, monitor-job.pprof.
	ProfileDir string
}

// DefaultMonitorLoad is 50 jobs of 240 frames of 8 tiles (96,000 tiles), 100 tile events a
// second, three 30 s windows a round, two rounds.
func DefaultMonitorLoad() MonitorLoad {
	return MonitorLoad{Jobs: 50, Frames: 240, Width: 256, Height: 128, TileSize: 64, Rate: 100, Window: 30 * time.Second, Rounds: 2}
}

// MonitorCPU is the coordinator's CPU in cores (CPU seconds a second) with the monitor closed
// and with each view open, each the mean over its windows.
type MonitorCPU struct {
	Jobs       int     `json:"jobs"`
	Frames     int     `json:"frames"`
	Tiles      int     `json:"tiles"`
	EventsPerS float64 `json:"events_per_s"` // tile events published a second during the windows
	Closed     float64 `json:"closed_cores"`
	JobsView   float64 `json:"jobs_view_cores"`
	JobView    float64 `json:"job_view_cores"`
	// Windows are every window measured, in order.
	Windows []MonitorWindow `json:"windows"`
}

// MonitorWindow is one window: what was open and the coordinator's CPU.
type MonitorWindow struct {
	Open  string  `json:"open"` // "none", "jobs" or "job"
	Cores float64 `json:"cores"`
}

// MeasureMonitor runs m against a coordinator process in dir (StartCoordinator).
func MeasureMonitor(ctx context.Context, bins farmtest.Binaries, dir string, b *bundle.Bundle, m MonitorLoad) (MonitorCPU, error) {
	res := MonitorCPU{Jobs: m.Jobs, Frames: m.Jobs * m.Frames}
	chromium, err := chromiumPath()
	if err != nil {
		return res, err
	}
	var extra []string
	debug := ""
	if m.ProfileDir != "" {
		if debug, err = proctest.FreeAddr(); err != nil {
			return res, err
		}
		extra = []string{"--debug-listen", debug}
	}
	srv, err := StartCoordinator(ctx, bins, dir, extra...)
	if err != nil {
		return res, err
	}
	defer srv.Close()
	c := client.New(srv.HTTP, "")
	if _, err := client.UploadScene(ctx, c, b, 0, nil); err != nil {
		return res, fmt.Errorf("uploading scene: %w", err)
	}
	// Each job its own frames, so the shot holds Jobs x Frames frames.
	var jobs []api.Status
	for j := range m.Jobs {
		req := api.SubmitRequest{SceneVersion: b.Version(), First: 1 + j*m.Frames, Last: (j + 1) * m.Frames, Width: m.Width, Height: m.Height,
			TileSize: m.TileSize, SPP: 1, Formats: []string{"png"}}
		st, err := c.Submit(ctx, b, req)
		if err != nil {
			return res, fmt.Errorf("submitting job %d: %w", j+1, err)
		}
		jobs = append(jobs, st.Status)
		res.Tiles += st.Status.TilesTotal
	}
	nc, err := nats.Connect(srv.NATSURL())
	if err != nil {
		return res, fmt.Errorf("connecting to the coordinator's jetstream: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	if err := waitDurable(ctx, js, uint64(res.Tiles)); err != nil {
		return res, err
	}

	// The workers: events at m.Rate a second, from the first job's first frame on.
	fctx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	var sent int
	feeding := make(chan string, 1) // the job being rendered, once asked
	feedErr := make(chan error, 1)
	fedSince := time.Now()
	go func() { feedErr <- feed(fctx, js, jobs, m, &sent, feeding) }()
	current := func() string {
		select {
		case id := <-feeding:
			return id
		case <-time.After(5 * time.Second):
			return jobs[0].JobID
		}
	}

	pid := srv.Coord.Pid()
	profiled := map[string]bool{}
	window := func(open string) error {
		if m.ProfileDir != "" && !profiled[open] {
			profiled[open] = true
			path := filepath.Join(m.ProfileDir, "monitor-"+open+".pprof")
			url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", debug, int(m.Window.Seconds()))
			go func() { _ = exec.CommandContext(ctx, "curl", "-sf", "-o", path, url).Run() }()
		}
		before, err := CPUTime(pid)
		if err != nil {
			return err
		}
		start := time.Now()
		if err := sleep(ctx, m.Window); err != nil {
			return err
		}
		after, err := CPUTime(pid)
		if err != nil {
			return err
		}
		res.Windows = append(res.Windows, MonitorWindow{Open: open, Cores: (after - before).Seconds() / time.Since(start).Seconds()})
		return nil
	}
	for range m.Rounds {
		if err := window("none"); err != nil {
			return res, err
		}
		for _, view := range []string{"jobs", "job"} {
			hash, ready := "#/", `document.querySelector('#jobs tbody tr')`
			if view == "job" {
				hash, ready = "#/jobs/"+current(), `document.querySelectorAll('#frames li[data-frame]').length > 0`
			}
			page, err := openMonitor(ctx, chromium, "http://"+srv.HTTP+"/"+hash, ready)
			if err != nil {
				return res, err
			}
			err = window(view)
			if err == nil {
				err = page.stillLive() // the window measured a page that was open all along
			}
			page.close()
			if err != nil {
				return res, err
			}
		}
	}
	stopFeed()
	if err := <-feedErr; err != nil && !errors.Is(err, context.Canceled) {
		return res, err
	}
	res.EventsPerS = float64(sent) / time.Since(fedSince).Seconds()
	means := map[string]*[2]float64{"none": {}, "jobs": {}, "job": {}}
	for _, w := range res.Windows {
		means[w.Open][0] += w.Cores
		means[w.Open][1]++
	}
	mean := func(open string) float64 { return means[open][0] / max(means[open][1], 1) }
	res.Closed, res.JobsView, res.JobView = mean("none"), mean("jobs"), mean("job")
	return res, nil
}

// feed publishes tile.completed for every tile of every frame but its last, job after job, at
// m.Rate a second, counting them in sent; asked on feeding, it says the job it is on.
func feed(ctx context.Context, js jetstream.JetStream, jobs []api.Status, m MonitorLoad, sent *int, feeding chan<- string) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for _, st := range jobs {
		for _, fr := range st.Frames {
			ft, err := tiles.FrameTiles(fr.FrameKey, m.Width, m.Height, m.TileSize)
			if err != nil {
				return err
			}
			for i, t := range ft[:len(ft)-1] {
				for float64(*sent) >= time.Since(start).Seconds()*float64(m.Rate) {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case feeding <- st.JobID:
					case <-tick.C:
					}
				}
				ev := wire.Event{ID: wire.EventTileCompleted + ":" + t.Key, Type: wire.EventTileCompleted, JobID: st.JobID, TileKey: t.Key,
					TileIndex: i, FrameKey: fr.FrameKey, Seq: 1, Delivery: 1, Worker: "bench", RenderMillis: int64(500 + 37*i),
					Time: time.Now().UTC()}
				data, err := json.Marshal(ev)
				if err != nil {
					return err
				}
				if _, err := js.PublishAsync(ev.Subject(), data); err != nil {
					return fmt.Errorf("publishing a tile event: %w", err)
				}
				*sent++
			}
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// monitorPage is the monitor open in a headless Chromium.
type monitorPage struct {
	ctx   context.Context // the browser's
	close func()
}

// stillLive checks the page still has its event stream open.
func (p monitorPage) stillLive() error {
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	live, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#live').textContent`))
	if err != nil || live != "live" {
		return fmt.Errorf("the monitor's page is no longer live (%q, %v)", live, err)
	}
	return nil
}

// openMonitor opens url in a headless Chromium and waits until the page is live (its event
// stream open) and ready is true.
func openMonitor(ctx context.Context, chromium, url, ready string) (monitorPage, error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 800), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancel := chromedp.NewContext(actx)
	closeAll := func() {
		cancel()
		cancelAlloc()
	}
	// The first Run starts the browser and ties it to its context: bctx's, not a timeout's,
	// or the browser would end with the wait below.
	if _, err := chromedp.Run(bctx, chromedp.Navigate("about:blank")); err != nil {
		closeAll()
		return monitorPage{}, fmt.Errorf("starting chromium: %w", err)
	}
	wctx, stop := context.WithTimeout(bctx, time.Minute)
	defer stop()
	if _, err := chromedp.Run(wctx, chromedp.Navigate(url)); err != nil {
		closeAll()
		return monitorPage{}, fmt.Errorf("opening the monitor: %w", err)
	}
	for {
		ok, err := chromedp.Run(wctx, chromedp.Evaluate[bool](`document.querySelector('#live').textContent === 'live' && !!(`+ready+`)`))
		if err != nil {
			closeAll()
			return monitorPage{}, fmt.Errorf("waiting for the monitor at %s: %w", url, err)
		}
		if ok {
			return monitorPage{ctx: bctx, close: closeAll}, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// chromiumPath is TILEFARM_CHROMIUM, or chromium on the PATH.
func chromiumPath() (string, error) {
	if p := os.Getenv("TILEFARM_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no Chromium for the monitor step: install it or set TILEFARM_CHROMIUM")
}
