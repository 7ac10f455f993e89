//go:build linux

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/tilefarm/tilefarm/internal/api"
)

// chromiumPath finds the headless browser the web tests drive: TILEFARM_CHROMIUM, or chromium
// on the PATH. A machine without one fails the tests: the web UI is tested, never skipped.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TILEFARM_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("TILEFARM_CHROMIUM=%s: %v", p, err)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium for the web tests: install it (apt-get install -y chromium, or run ./test.sh) or set TILEFARM_CHROMIUM")
	return ""
}

// browser is a headless Chromium tab that records what a page must never do: log an error
// to its console, throw, or have a request fail.
type browser struct {
	t     *testing.T
	ctx   context.Context
	base  string
	shots string

	mu       sync.Mutex
	problems []string
	got401   []string // requests answered 401, allowed only where a test says so
	urls     []string // every request URL
}

func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 800), chromedp.Flag("disable-dev-shm-usage", true))
	b := &browser{t: t, base: base, shots: t.TempDir()}
	// On a loaded machine Chromium now and then exits before it listens; that is the test
	// harness's browser failing to start, not the page under test, so it gets two more tries.
	const tries = 3
	for try := 1; ; try++ {
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancel := chromedp.NewContext(actx)
		b.ctx = ctx
		err := chromedp.Listen(ctx, b.observe)
		if err == nil {
			t.Cleanup(func() {
				cancel()
				cancelAlloc()
			})
			return b
		}
		cancel()
		cancelAlloc()
		if try == tries {
			t.Fatalf("starting chromium (%d tries): %v", tries, err)
		}
		t.Logf("starting chromium, try %d of %d: %v", try, tries, err)
	}
}

func (b *browser) observe(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError {
			var args []string
			for _, a := range e.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			b.problems = append(b.problems, "console error: "+strings.Join(args, " "))
		}
	case *runtime.EventExceptionThrown:
		d := e.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.problems = append(b.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, msg))
	case *network.EventRequestWillBeSent:
		b.urls = append(b.urls, e.Request.URL)
	case *network.EventResponseReceived:
		switch {
		case e.Response.Status == http.StatusUnauthorized:
			b.got401 = append(b.got401, e.Response.URL)
		case e.Response.Status >= 400:
			b.problems = append(b.problems, fmt.Sprintf("request %s answered %d", e.Response.URL, e.Response.Status))
		}
	case *network.EventLoadingFailed:
		if !e.Canceled {
			b.problems = append(b.problems, fmt.Sprintf("request %s failed: %s", e.RequestID, e.ErrorText))
		}
	}
}

// do runs actions, failing the test on an error.
func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// eval evaluates a JavaScript expression into T.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitTrue polls a JavaScript expression until it is true.
func (b *browser) waitTrue(expr string, d time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(d)
	for !eval[bool](b, "!!("+expr+")") {
		if time.Now().After(deadline) {
			b.t.Fatalf("the page never got to %s; it shows:\n%s", expr, eval[string](b, "document.body.innerText"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// open loads the page and waits for the event stream to be live.
func (b *browser) open() {
	b.t.Helper()
	b.do(chromedp.Navigate(b.base + "/"))
	b.waitTrue(`document.querySelector('#live').textContent === 'live'`, 30*time.Second)
}

// route changes the view without reloading the page.
func (b *browser) route(hash string) {
	b.t.Helper()
	b.do(chromedp.Evaluate[chromedp.Void](fmt.Sprintf("location.hash = %q", hash)))
}

// screenshot saves the page as name.png under the test's temp dir.
func (b *browser) screenshot(name string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(b.shots, name+".png")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot of the %s view: %s", name, p)
	// TILEFARM_WEB_SCREENSHOTS keeps a copy past the test's temp dir, named after the test.
	if dir := os.Getenv("TILEFARM_WEB_SCREENSHOTS"); dir != "" {
		keep := filepath.Join(dir, b.t.Name()+"-"+name+".png")
		if err := os.WriteFile(keep, buf, 0o644); err != nil {
			b.t.Fatal(err)
		}
		b.t.Logf("kept as %s", keep)
	}
	return p
}

// clean asserts the page logged no console error, threw nothing and had no request fail;
// allow401 allows answers 401.
func (b *browser) clean(allow401 bool) {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	problems := b.problems
	if !allow401 {
		for _, u := range b.got401 {
			problems = append(problems, "request "+u+" answered 401")
		}
	}
	if len(problems) > 0 {
		b.t.Fatalf("the page had problems:\n%s", strings.Join(problems, "\n"))
	}
}

// canvasIsFrame asserts the frame view's canvas equals frame 1 of job as `coordinator outputs`
// writes it, pixel for pixel.
func (b *browser) canvasIsFrame(f *farmProc, job string) {
	t := b.t
	t.Helper()
	url := eval[string](b, `document.querySelector('#frame-canvas').toDataURL('image/png')`)
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(url, "data:image/png;base64,"))
	if err != nil {
		t.Fatalf("decoding the canvas: %v", err)
	}
	canvasPNG := filepath.Join(t.TempDir(), "canvas.png")
	if err := os.WriteFile(canvasPNG, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "o_####.png")
	if r := f.cli("outputs", job, "--out", out); r.code != 0 {
		t.Fatalf("outputs: %s", r)
	}
	samePixels(t, canvasPNG, frameFile(out, 1))
}

// apiStatus reads a job's status over HTTP, quicker than the CLI for polling.
func apiStatus(t *testing.T, f *farmProc, job string) api.Status {
	t.Helper()
	resp, err := http.Get("http://" + f.HTTP + "/v1/jobs/" + job)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st api.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decoding status: %v", err)
	}
	return st
}

// The jobs view shows a job submitted from the CLI without a reload; the frame view draws the
// tiles as they complete, and once the frame is done its canvas is the frame's PNG pixel for
// pixel. Nothing logs an error or fails, and every view is photographed.
func TestWebLiveJobsAndFrame(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir())
	b := newBrowser(t, "http://"+f.HTTP)
	b.open()
	b.waitTrue(`document.querySelector('#jobs')`, 10*time.Second)
	f.worker("w", t.TempDir(), "--fault-pass-delay", "100ms", "--checkpoint-every", "0")
	settings := []string{"--width", "160", "--height", "96", "--spp", "8", "--tile", "32"} // 15 tiles
	st, r := f.submit(append([]string{scene, "--frames", "1"}, settings...)...)
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	b.waitTrue(fmt.Sprintf(`document.querySelector('#jobs tr[data-job=%q]')`, st.JobID), 15*time.Second)
	b.screenshot("jobs")

	b.route("#/jobs/" + st.JobID + "/frames/1")
	b.waitTrue(`document.querySelector('#frame-canvas')`, 10*time.Second)
	var seen []int
	midShot := false
	deadline := time.Now().Add(3 * time.Minute)
	for {
		drawn := eval[int](b, `Number(document.querySelector('#frame-canvas')?.dataset.tilesDrawn || 0)`)
		now := apiStatus(t, f, st.JobID)
		if now.Frames[0].State != api.FrameCompleted && (len(seen) == 0 || drawn > seen[len(seen)-1]) {
			seen = append(seen, drawn)
			if drawn >= 6 && !midShot {
				b.screenshot("frame-rendering")
				midShot = true
			}
		}
		if drawn == 15 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the canvas has %d tiles drawn after 3 minutes (status %+v)", drawn, now)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("tiles drawn while the frame rendered: %v", seen)
	var rising []int
	for _, n := range seen {
		if n > 0 {
			rising = append(rising, n)
		}
	}
	if len(rising) < 2 {
		t.Fatalf("the canvas did not fill in as tiles completed: tiles drawn seen before the frame completed %v", seen)
	}
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job: %+v", done)
	}
	b.waitTrue(`document.querySelector('#downloads a[data-format=png]')`, 15*time.Second)
	b.screenshot("frame")

	b.canvasIsFrame(f, st.JobID)

	b.route("#/jobs/" + st.JobID)
	b.waitTrue(`document.querySelector('#frames li[data-state=completed]')`, 10*time.Second)
	b.screenshot("job")
	b.route("#/workers")
	b.waitTrue(`document.querySelector('#workers tr[data-worker=w]')`, 10*time.Second)
	// The page says which coordinator leads the farm: this one, the only one.
	b.waitTrue(`document.querySelector('#leader')?.dataset.this === '1' && document.querySelector('#leader').textContent.includes('This coordinator leads the farm')`, 10*time.Second)
	b.screenshot("workers")
	b.route("#/dlq")
	b.waitTrue(`document.querySelector('#dlq tbody tr')`, 10*time.Second)
	b.screenshot("dlq")
	// A narrow window still shows every job with its state and its buttons.
	b.do(chromedp.EmulateViewport(400, 800))
	b.route("#/")
	b.waitTrue(fmt.Sprintf(`document.querySelector('#jobs tr[data-job=%q] [data-col=state]')?.textContent === 'completed'`, st.JobID), 10*time.Second)
	b.waitTrue(`(r => r && r.width > 0 && r.right <= innerWidth)(document.querySelector('#jobs button[data-action=priority]')?.getBoundingClientRect())`, 5*time.Second)
	b.screenshot("jobs-narrow")
	b.clean(false)
}

// A Blender frame's tiles have no PNG of their own (Blender's compositor and colour management
// encode the frame), so the frame view says so while it renders and, once the frame is done,
// shows the frame's PNG, its Composite: the canvas equals `coordinator outputs` pixel for pixel,
// the .blend's own output is offered by its own name, and nothing fails.
func TestWebBlenderFrameShowsTheFinishedPNG(t *testing.T) {
	t.Parallel()
	f := startServe(t, t.TempDir())
	b := newBrowser(t, "http://"+f.HTTP)
	b.open()
	f.worker("w", t.TempDir())
	st, r := f.submit(blenderExample(t), "--frames", "1", "--spp", "4", "--tile", "80") // 4 tiles
	if r.code != 42 {
		t.Fatalf("submit: %s", r)
	}
	b.route("#/jobs/" + st.JobID + "/frames/1")
	b.waitTrue(`document.querySelector('#frame-note')?.textContent.includes("A Blender scene")`, 30*time.Second)
	if done := f.waitDone(st.JobID, 3*time.Minute); done.State != api.JobCompleted {
		t.Fatalf("job: %+v", done)
	}
	b.waitTrue(`document.querySelector('#frame-canvas')?.dataset.frameDrawn === '1'`, 30*time.Second)
	if n := eval[int](b, `Number(document.querySelector('#frame-canvas').dataset.tilesDrawn || 0)`); n != 0 {
		t.Fatalf("%d tiles drawn on a Blender frame's canvas, want none", n)
	}
	b.screenshot("blender-frame")
	b.canvasIsFrame(f, st.JobID)
	// The .blend's own output is offered under the name Blender gives it (the example writes to
	// Blender's default output path, /tmp/, as 0001.png), beside the farm's png.
	b.waitTrue(`document.querySelector('#downloads a[data-format=blend]')?.textContent === '0001.png'`, 10*time.Second)
	b.clean(false)
}

// Cancel from the page stops the job; Requeue from the page brings a dead-lettered tile back
// and its frame completes.
func TestWebCancelAndRequeue(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--max-failures", "1")
	bad := f.worker("w-bad", t.TempDir(), "--fault-panic-tile", "1:0,0,32,27", "--fault-pass-delay", "100ms", "--checkpoint-every", "0")
	b := newBrowser(t, "http://"+f.HTTP)
	b.open()

	dead, _ := f.submit(append([]string{scene, "--frames", "1"}, small...)...)
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(f.deadLetters(), "tiles."); {
		if time.Now().After(deadline) {
			t.Fatalf("the faulty tile was never dead-lettered:\n%s", bad.Log())
		}
		time.Sleep(250 * time.Millisecond)
	}

	// Cancel: a slow job, cancelled from the jobs view once it has made progress.
	slow, _ := f.submit(append([]string{scene, "--frames", "2-4"}, small...)...)
	for deadline := time.Now().Add(2 * time.Minute); apiStatus(t, f, slow.JobID).TilesCompleted < 1; {
		if time.Now().After(deadline) {
			t.Fatal("the job to cancel made no progress")
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.route("#/")
	cancel := fmt.Sprintf(`#jobs tr[data-job=%q] button[data-action=cancel]`, slow.JobID)
	b.waitTrue(fmt.Sprintf(`document.querySelector(%q) && !document.querySelector(%q).disabled`, cancel, cancel), 10*time.Second)
	b.do(chromedp.Click(cancel))
	b.waitTrue(fmt.Sprintf(`document.querySelector('#jobs tr[data-job=%q] [data-col=state]')?.textContent === 'cancelled'`, slow.JobID), 10*time.Second)
	atCancel := apiStatus(t, f, slow.JobID)
	if atCancel.State != api.JobCancelled {
		t.Fatalf("the job cancelled from the page is %s", atCancel.State)
	}
	if atCancel.TilesCompleted >= atCancel.TilesTotal {
		t.Fatalf("the job was done before the cancel: %+v", atCancel)
	}
	time.Sleep(2 * time.Second) // anything still rendering for it would land now
	// With one slot, at most the tile rendering at the cancel may still finish.
	if after := apiStatus(t, f, slow.JobID); after.TilesCompleted > atCancel.TilesCompleted+1 || after.State != api.JobCancelled {
		t.Fatalf("after the cancel: %d tiles completed (%d at the cancel), state %s", after.TilesCompleted, atCancel.TilesCompleted, after.State)
	}

	// Requeue: the faulty worker goes, a healthy one comes, and the page requeues the tile.
	bad.Kill()
	f.worker("w-good", t.TempDir(), "--checkpoint-every", "0")
	b.route("#/dlq")
	b.waitTrue(`document.querySelector('#dlq button[data-action=requeue]')`, 15*time.Second)
	b.screenshot("dlq")
	b.do(chromedp.Click(`#dlq button[data-action=requeue]`))
	b.waitTrue(`!document.querySelector('#dlq button[data-action=requeue]')`, 30*time.Second)
	for deadline := time.Now().Add(2 * time.Minute); ; {
		st := apiStatus(t, f, dead.JobID)
		if st.State == api.JobCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the requeued tile's job never completed: %+v", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	outputsEqualReference(t, f, dead.JobID, scene, []int{1}, small...)
	b.route("#/jobs/" + dead.JobID)
	b.waitTrue(`document.querySelector('#frames li[data-frame="1"][data-state=completed]')`, 15*time.Second)
	b.clean(false)
}

// With a token required, the page shows no job data and its API calls get 401 until the token
// is entered; then the jobs appear. The token never travels in a URL.
func TestWebTokenRequired(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	data := t.TempDir()
	token := "tf-web-" + strings.Repeat("7", 20)
	tokenFile := filepath.Join(t.TempDir(), "api-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFarm(t, data)
	f.Env = []string{"TILEFARM_API_TOKEN=" + token}
	f.restart("--api-token-file", tokenFile, "--workers", "1")
	st, _ := f.submit(append([]string{scene, "--frames", "1"}, small...)...)

	b := newBrowser(t, "http://"+f.HTTP)
	b.do(chromedp.Navigate(b.base + "/"))
	b.waitTrue(`!document.querySelector('#token-form').hidden`, 15*time.Second)
	b.screenshot("token")
	if text := eval[string](b, `document.body.innerText`); strings.Contains(text, "job-") || strings.Contains(text, "shot") {
		t.Fatalf("the page shows job data without the token:\n%s", text)
	}
	b.mu.Lock()
	refused := len(b.got401)
	b.mu.Unlock()
	if refused == 0 {
		t.Fatal("no API call of the page was answered 401")
	}
	b.do(chromedp.SendKeys(`#token-input`, token), chromedp.Click(`#token-submit`))
	b.waitTrue(fmt.Sprintf(`document.querySelector('#jobs tr[data-job=%q]')`, st.JobID), 15*time.Second)
	b.waitTrue(`document.querySelector('#live').textContent === 'live'`, 15*time.Second)
	if got := eval[string](b, `sessionStorage.getItem('tilefarm.token')`); got != token {
		t.Fatalf("sessionStorage holds %q", got)
	}
	b.mu.Lock()
	for _, u := range b.urls {
		if strings.Contains(u, token) {
			t.Errorf("the token travelled in a URL: %s", u)
		}
	}
	after := len(b.got401)
	b.mu.Unlock()
	if after != refused {
		t.Errorf("%d more requests were refused after the token was entered", after-refused)
	}
	b.clean(true)
}
