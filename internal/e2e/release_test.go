//go:build linux

package e2e

import (
	"archive/zip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tilefarm/tilefarm/internal/proctest"
)

// Property: release.sh writes, for each target, an archive of both commands that run on that
// target and say their version, the add-on's zip, and checksums of everything it wrote
// (docs/operations.md, "Platforms"). Two targets here, Linux and Windows (run under Wine):
// the script builds each target alike.
func TestReleaseArchivesRunOnTheirSystems(t *testing.T) {
	t.Parallel()
	win := newWineHost(t)
	root, err := proctest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dist := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "release.sh"), dist)
	cmd.Env = append(os.Environ(), "TILEFARM_RELEASE_TARGETS=linux/amd64 windows/amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(dist, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(raw))
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dist
	if out, err := check.CombinedOutput(); err != nil || strings.Count(string(out), ": OK") != 4 {
		t.Fatalf("the checksums of the release (want 4 files): %v\n%s", err, out)
	}
	rev := version // what every binary's --version says first

	linux := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dist, "tilefarm-"+version+"-linux-amd64.tar.gz"), "-C", linux).CombinedOutput(); err != nil {
		t.Fatalf("unpacking the Linux archive: %v\n%s", err, out)
	}
	for _, name := range []string{"coordinator", "tileworker"} {
		out, err := exec.Command(filepath.Join(linux, "tilefarm-"+version+"-linux-amd64", name), "--version").Output()
		if err != nil || !strings.HasPrefix(string(out), name+" "+rev+" ") || !strings.Contains(string(out), "tilefarm/") {
			t.Fatalf("the Linux %s --version: %v, %q (want the revision %s and the build fingerprint)", name, err, out, rev)
		}
	}

	zw, err := zip.OpenReader(filepath.Join(dist, "tilefarm-"+version+"-windows-amd64.zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	exes := t.TempDir()
	for _, f := range zw.File {
		if !strings.HasSuffix(f.Name, ".exe") {
			continue
		}
		r, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(exes, filepath.Base(f.Name)), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	win.bins = exes
	for _, name := range []string{"coordinator", "tileworker"} {
		if r := win.run(t, name, "--version"); r.code != 0 || !strings.HasPrefix(r.stdout, name+" "+rev+" ") || !strings.Contains(r.stdout, "windows") {
			t.Fatalf("%s.exe --version from the Windows archive: %s", name, r)
		}
	}
	addon, err := zip.OpenReader(filepath.Join(dist, "tilefarm-addon-"+version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer addon.Close()
	if _, err := addon.Open("tilefarm/__init__.py"); err != nil {
		t.Fatalf("the add-on's zip: %v", err)
	}
}
