//go:build linux

package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tilefarm/tilefarm/internal/api"
)

// boxThumbnail is a frame scaled as docs/web.md defines a thumbnail, written here apart from
// the coordinator's code: k = ceil(max(w, h) / 160), at least 1; the thumbnail is
// ceil(w/k) x ceil(h/k), each pixel the mean of its k x k block (cut at the edges) per channel
// of 8-bit non-premultiplied RGBA, rounded half up.
func boxThumbnail(img image.Image) *image.NRGBA {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	k := 1
	for (max(w, h)+k-1)/k > 160 {
		k++
	}
	out := image.NewNRGBA(image.Rect(0, 0, (w+k-1)/k, (h+k-1)/k))
	for ty := 0; ty < out.Rect.Dy(); ty++ {
		for tx := 0; tx < out.Rect.Dx(); tx++ {
			var sum [4]int
			n := 0
			for y := ty * k; y < ty*k+k && y < h; y++ {
				for x := tx * k; x < tx*k+k && x < w; x++ {
					c := color.NRGBAModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA)
					sum[0], sum[1], sum[2], sum[3] = sum[0]+int(c.R), sum[1]+int(c.G), sum[2]+int(c.B), sum[3]+int(c.A)
					n++
				}
			}
			out.SetNRGBA(tx, ty, color.NRGBA{uint8((sum[0] + n/2) / n), uint8((sum[1] + n/2) / n), uint8((sum[2] + n/2) / n), uint8((sum[3] + n/2) / n)})
		}
	}
	return out
}

// canvasImage decodes the canvas sel as the page holds it.
func (b *browser) canvasImage(sel string) image.Image {
	b.t.Helper()
	url := eval[string](b, fmt.Sprintf(`document.querySelector(%q).toDataURL('image/png')`, sel))
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(url, "data:image/png;base64,"))
	if err != nil {
		b.t.Fatalf("decoding canvas %s: %v", sel, err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		b.t.Fatalf("decoding canvas %s: %v", sel, err)
	}
	return img
}

// apiGet decodes the JSON the coordinator serves at path into v.
func apiGet(t *testing.T, f *farmProc, path string, v any) {
	t.Helper()
	resp, err := http.Get("http://" + f.HTTP + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
}

// The job view is a contact sheet: it fills in with a thumbnail per finished frame, each equal
// to the frame's PNG scaled as documented, while frames still rendering are drawn as such; its
// chart of render time per frame marks the frame with a tile made slow on purpose, and that
// frame's heat map shows the slow tile as the hottest, first of the slowest tiles.
func TestWebContactSheetAndWhereTheTimeGoes(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	// 320x192 in 64 px tiles: 5x3 tiles a frame; frame 2's tile (128,64)-(192,128) sleeps
	// 600 ms after each of its 4 passes, about five times what a frame's 15 tiles take.
	f.worker("w", t.TempDir(), "--fault-slow-tile", "2:128,64,192,128:600ms", "--checkpoint-every", "0")
	b := newBrowser(t, "http://"+f.HTTP)
	b.open() // before the job: the browser's start costs its frames no time
	settings := []string{"--width", "320", "--height", "192", "--spp", "4", "--tile", "64"}
	st, r := f.submit(append([]string{scene, "--frames", "1-3"}, settings...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	b.route("#/jobs/" + st.JobID)
	b.waitTrue(`document.querySelectorAll('#frames li[data-frame]').length === 3`, 15*time.Second)
	drawn := func() int { return eval[int](b, `Number(document.querySelector('#frames').dataset.thumbnailsDrawn)`) }
	sawUnfinished, sawPartial := false, false
	for deadline := time.Now().Add(2 * time.Minute); drawn() < 3; time.Sleep(100 * time.Millisecond) {
		if eval[bool](b, `!!document.querySelector('#frames li[data-state=queued], #frames li[data-state=rendering]')`) {
			sawUnfinished = true
		}
		if n := drawn(); n > 0 && n < 3 {
			sawPartial = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d thumbnails drawn after 2 minutes", drawn())
		}
	}
	if !sawUnfinished || !sawPartial {
		t.Fatalf("the sheet never showed a frame unfinished (%v) or some thumbnails drawn but not all (%v)", sawUnfinished, sawPartial)
	}
	// The job's status, fetched at most every 2 s, catches up with the cards.
	b.waitTrue(`document.querySelector('#job-head h2 .state')?.textContent === 'completed'`, 10*time.Second)
	b.waitTrue(`document.querySelector('#frame-times').dataset.framesTimed === '3'`, 10*time.Second)
	b.screenshot("job")

	// Each thumbnail drawn is the frame's PNG scaled, pixel for pixel.
	out := filepath.Join(t.TempDir(), "o_####.png")
	if r := f.cli("outputs", st.JobID, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	for n := 1; n <= 3; n++ {
		want := boxThumbnail(decodePNG(t, frameFile(out, n)))
		got := b.canvasImage(fmt.Sprintf(`#frames li[data-frame="%d"] canvas`, n))
		if got.Bounds() != want.Bounds() || want.Bounds() != image.Rect(0, 0, 160, 96) {
			t.Fatalf("thumbnail of frame %d is %v, want %v (320x192 halved)", n, got.Bounds(), want.Bounds())
		}
		for y := 0; y < 96; y++ {
			for x := 0; x < 160; x++ {
				if g, w := color.NRGBAModel.Convert(got.At(x, y)), want.NRGBAAt(x, y); g != w {
					t.Fatalf("thumbnail of frame %d at (%d,%d) = %v, want %v", n, x, y, g, w)
				}
			}
		}
	}

	// The chart marks frame 2, whose slow tile made it the spike.
	if slowest := eval[string](b, `document.querySelector('#frame-times').dataset.slowestFrame`); slowest != "2" {
		t.Fatalf("the chart's slowest frame is %q, want 2 (its tile sleeps 2.4 s)", slowest)
	}
	// Frame 2's heat map: the slow tile is the hottest and heads the slowest tiles.
	var ft api.FrameTiles
	apiGet(t, f, fmt.Sprintf("/v1/jobs/%s/frames/2/tiles", st.JobID), &ft)
	slow := -1
	for _, ti := range ft.Tiles {
		if ti.Rect == (api.TileRect{X0: 128, Y0: 64, X1: 192, Y1: 128}) {
			slow = ti.Index
		}
	}
	b.do(chromedp.Click(`#frames li[data-frame="2"] a`))
	b.waitTrue(`document.querySelector('#heat-canvas')?.dataset.tilesTimed === '15'`, 15*time.Second)
	if hottest := eval[string](b, `document.querySelector('#heat-canvas').dataset.hottest`); hottest != fmt.Sprint(slow) {
		t.Fatalf("the heat map's hottest tile is %s, want the slow tile %d", hottest, slow)
	}
	if first := eval[string](b, `document.querySelector('#slowest li').dataset.tile`); first != fmt.Sprint(slow) {
		t.Fatalf("the slowest tiles start with tile %s, want %d", first, slow)
	}
	b.waitTrue(`document.querySelector('#frame-canvas')?.dataset.tilesDrawn === '15'`, 15*time.Second)
	b.screenshot("frame")
	b.clean(false)
}

// The workers page shows both workers with their slots (busy over the last minutes, one
// sample a heartbeat), what they render, their pools and tags and their recent failures; a
// dead letter's page shows the failure's message and the worker's log of the attempt, and
// opens the tile's attempts.
func TestWebWorkersAndDeadLetter(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--max-failures", "1")
	faulty := []string{"--concurrency", "2", "--fault-panic-tile", "1:0,0,32,27", "--fault-pass-delay", "150ms", "--checkpoint-every", "0"}
	f.worker("w1", t.TempDir(), faulty...)
	f.worker("w2", t.TempDir(), append([]string{"--tags", "gpu"}, faulty...)...)
	b := newBrowser(t, "http://"+f.HTTP)
	b.open()
	st, r := f.submit(append([]string{scene, "--frames", "1-3"}, small...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	b.route("#/workers")
	row := func(w string) string { return fmt.Sprintf(`#workers tr[data-worker=%q]`, w) }
	for _, w := range []string{"w1", "w2"} {
		b.waitTrue(fmt.Sprintf(`document.querySelector('%s .busy')?.textContent.endsWith('of 2 slots busy')`, row(w)), 15*time.Second)
	}
	b.waitTrue(`document.querySelector('#workers td[data-col=failures] a')`, 2*time.Minute)
	// Two heartbeats of each, 5 s apart, while they render.
	b.waitTrue(fmt.Sprintf(`[%q, %q].every((r) => Number(document.querySelector(r + ' canvas.spark')?.dataset.samples) >= 2)`,
		row("w1"), row("w2")), 30*time.Second)
	if text := eval[string](b, fmt.Sprintf(`document.querySelector('%s td[data-col=pools]').textContent`, row("w2"))); !strings.Contains(text, "any worker") || !strings.Contains(text, "tags gpu") {
		t.Fatalf("w2's pools and tags read %q, want the pool of any worker and its tag gpu", text)
	}
	b.screenshot("workers")
	// A heartbeat says how busy the slots were since the one before, so the first (at the
	// worker's start, perhaps before the job arrived) may read idle: wait for a beat taken
	// while each rendered, then check what every beat says.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		var ws api.WorkersResponse
		apiGet(t, f, "/v1/workers?detail=1", &ws)
		problem := ""
		for _, w := range ws.Workers {
			busy := 0.0
			for _, s := range w.History {
				busy = max(busy, s.Busy)
			}
			if w.Slots != 2 || busy <= 0 || busy > 2 {
				problem = fmt.Sprintf("worker %s: %d slots, at most %v busy over %d heartbeats; want 2 slots, some busy", w.Name, w.Slots, busy, len(w.History))
			}
		}
		if len(ws.Workers) != 2 {
			problem = fmt.Sprintf("%d workers listed, want w1 and w2", len(ws.Workers))
		}
		if problem == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(problem)
		}
	}

	// The dead letter, opened from the list: its reason and its attempt's log.
	b.route("#/dlq")
	b.waitTrue(`document.querySelector('#dlq a[href^="#/dlq/"]')`, 15*time.Second)
	b.do(chromedp.Click(`#dlq a[href^="#/dlq/"]`))
	b.waitTrue(`document.querySelector('#dl-reason')?.textContent.includes('injected fault in frame 1')`, 15*time.Second)
	b.waitTrue(`document.querySelector('#attempts li[data-dead-lettered="1"] pre.log')`, 15*time.Second)
	log := eval[string](b, `document.querySelector('#attempts li[data-dead-lettered="1"] pre.log').textContent`)
	for _, want := range []string{`msg=dead-lettering`, "class=panic", "injected fault in frame 1", `msg="rendering tile"`} {
		if !strings.Contains(log, want) {
			t.Fatalf("the dead letter's log tail lacks %q:\n%s", want, log)
		}
	}
	b.screenshot("dead-letter")
	b.do(chromedp.Click(`#dl-head a[href*="/tiles/"]`))
	b.waitTrue(`document.querySelector('#tile-head h2')?.textContent.startsWith('Tile 0 of frame 1')`, 15*time.Second)
	b.waitTrue(`document.querySelector('#tile-attempts pre.log')`, 5*time.Second)
	b.screenshot("tile-attempts")
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != api.JobFailed {
		t.Fatalf("job with a dead-lettered tile: %+v", done)
	}
	b.clean(false)
}
