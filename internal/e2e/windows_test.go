//go:build linux

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/proctest"
)

// Environment variables test.sh sets for the Windows tests: Debian's wine64, and a prefix it
// prepared once (with the one system library Go's Windows runtime needs that Wine 8 lacks).
const (
	envWine       = "TILEFARM_WINE"
	envWinePrefix = "TILEFARM_WINEPREFIX"
)

// windowsBins builds coordinator.exe and tileworker.exe once per test binary.
var windowsBins = sync.OnceValues(func() (string, error) {
	root, err := proctest.ModuleRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "tilefarm-windows-bins-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/coordinator", "./cmd/tileworker")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=windows", "GOARCH=amd64", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", errors.New("building the Windows binaries: " + err.Error() + ": " + string(out))
	}
	return dir, nil
})

// wineHost runs the Windows build of each farm command under Wine on this machine: a Windows
// desktop or render node beside a Linux farm (farmtest.Host).
type wineHost struct{ wine, prefix, bins string }

// newWineHost is the Windows host, or a failed test saying what is missing.
func newWineHost(t *testing.T) wineHost {
	t.Helper()
	wine, prefix := os.Getenv(envWine), os.Getenv(envWinePrefix)
	if wine == "" || prefix == "" {
		t.Fatalf("the Windows tests need $%s and $%s (test.sh installs Debian's wine64 and prepares the prefix)", envWine, envWinePrefix)
	}
	bins, err := windowsBins()
	if err != nil {
		t.Fatal(err)
	}
	return wineHost{wine: wine, prefix: prefix, bins: bins}
}

// Command runs the .exe of the command name (a path to the Linux build or a bare name).
func (w wineHost) Command(name string, args ...string) *exec.Cmd {
	exe := filepath.Join(w.bins, filepath.Base(name)+".exe")
	return exec.Command("env", append([]string{"WINEPREFIX=" + w.prefix, "WINEDEBUG=-all", w.wine, exe}, args...)...)
}

func (w wineHost) HTTPClient() *http.Client { return http.DefaultClient }

// run runs a Windows command to completion.
func (w wineHost) run(t *testing.T, name string, args ...string) result {
	t.Helper()
	cmd := w.Command(name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s.exe under Wine: %v", name, err)
	}
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// Property: the Windows coordinator.exe is a full client of a Linux farm: submit --wait of a
// JSON scene from a Windows desktop, status, watch and outputs give frames equal to the
// reference render pixel for pixel.
func TestWindowsCommandsAgainstALinuxFarm(t *testing.T) {
	t.Parallel()
	win := newWineHost(t)
	scene := example("shot")
	f := startServe(t, t.TempDir())
	f.worker("linux", t.TempDir())
	args := append([]string{"submit", scene, "--frames", "1-2", "--no-movie", "--wait", "--json", "--server", f.HTTP}, small...)
	r := win.run(t, "coordinator", args...)
	var st api.Status
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.State != api.JobCompleted {
		t.Fatalf("coordinator.exe submit --wait: %s", r)
	}
	if r := win.run(t, "coordinator", "status", st.JobID, "--server", f.HTTP); r.code != 0 || !strings.Contains(r.stdout, "completed") {
		t.Fatalf("coordinator.exe status: %s", r)
	}
	if r := win.run(t, "coordinator", "watch", st.JobID, "--server", f.HTTP); r.code != 0 {
		t.Fatalf("coordinator.exe watch: %s", r)
	}
	out := filepath.Join(t.TempDir(), "o_####.png")
	if r := win.run(t, "coordinator", "outputs", st.JobID, "--out", out, "--server", f.HTTP); r.code != 0 {
		t.Fatalf("coordinator.exe outputs: %s", r)
	}
	for _, fr := range []int{1, 2} {
		samePixels(t, frameFile(out, fr), reference(t, scene, fr, small...))
	}
}

// Property: a Windows tileworker.exe renders tiles of a Linux farm's job, checkpointing on its
// disk and to the store; killed mid-tile, a Linux worker resumes the tile from its remote
// checkpoint, and the frame equals the reference pixel for pixel.
func TestWindowsWorkerKilledMidTileResumesOnLinux(t *testing.T) {
	t.Parallel()
	win := newWineHost(t)
	scene := example("shot")
	f := startServe(t, t.TempDir(), "--ack-wait", "3s", "--lease-ttl", "3s")
	w, err := f.StartWorker(farmtest.WorkerSpec{Name: "windows", Host: win,
		Args: []string{"--fault-pass-delay", "300ms", "--passes", "32", "--checkpoint-every", "0", "--remote-checkpoint-every", "0"}})
	if err != nil {
		t.Fatal(err)
	}
	killAtEnd(t, w.Proc, "tileworker.exe")
	st, r := f.submit(append([]string{scene, "--frames", "3", "--no-movie"}, oneTile...)...)
	if r.code != 42 && r.code != 3 {
		t.Fatalf("submit: %s", r)
	}
	waitCheckpoint(t, w.Proc, 8)
	waitLog(t, w.Proc, `remote checkpoint uploaded`, patience*time.Minute)
	if mid, _ := f.status(st.JobID); mid.State == api.JobCompleted {
		t.Fatalf("the job completed before the Windows worker was killed: %+v", mid)
	}
	w.Proc.Kill()
	f.worker("linux", t.TempDir())
	done := f.waitDone(st.JobID, 2*time.Minute)
	assertExact(t, done)
	if done.SamplesRecovered == 0 {
		t.Fatalf("the Linux worker did not resume the Windows worker's tile: %+v", done)
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{3}, oneTile...)
	t.Logf("figures: samples recovered from the Windows worker's checkpoint %d of %d", done.SamplesRecovered, done.SamplesTotal)
}
