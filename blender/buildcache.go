package blender

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// buildCache remembers the fingerprint a Blender reported on this machine (Options.BuildCache),
// one small file per key, so a worker starting again knows its build without starting Blender,
// which costs a second or two of CPU a start. The key is everything the fingerprint depends on:
// the executable (its resolved path, size and modification time), the kernel cap and the CYCLES_
// variables, the driver, the host and its CPU. Any of them changing makes another key; a
// process that reports another fingerprint than the remembered one drops it (Pool.take).
type buildCache struct {
	path string // the file of this pool's key; "" remembers nothing
}

// cachedBuild is what a file of the cache holds.
type cachedBuild struct {
	Build string `json:"build"`
}

// newBuildCache is the cache entry of the Blender o names, or one that remembers nothing when
// o has no BuildCache or a part of the key cannot be read (this machine's CPU, say).
func newBuildCache(o Options) buildCache {
	if o.BuildCache == "" {
		return buildCache{}
	}
	parts, ok := binaryIdentity(o.Binary)
	if !ok {
		return buildCache{}
	}
	cpu := cpuIdentity()
	if cpu == "" {
		return buildCache{}
	}
	host, err := os.Hostname()
	if err != nil {
		return buildCache{}
	}
	var cycles []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CYCLES_") {
			cycles = append(cycles, kv)
		}
	}
	slices.Sort(cycles)
	h := sha256.New()
	for _, part := range append(parts, o.Kernel, strings.Join(cycles, "\n"), DriverVersion, host, cpu) {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return buildCache{path: filepath.Join(o.BuildCache, hex.EncodeToString(h.Sum(nil)[:16])+".json")}
}

// binaryIdentity is what identifies the build binary runs: the executable's resolved path,
// size and modification time; for a Python (IsPython), also the path it was named by (the
// Pythons of several virtual environments are one executable) and the bpy module it imports
// from its environment's site-packages. False where that cannot be known (a bpy installed
// elsewhere): such a build is asked every time.
func binaryIdentity(binary string) ([]string, bool) {
	named, err := exec.LookPath(binary)
	if err != nil {
		return nil, false
	}
	if named, err = filepath.Abs(named); err != nil {
		return nil, false
	}
	files := []string{named}
	if IsPython(binary) {
		mods, _ := filepath.Glob(filepath.Join(filepath.Dir(named), "..", "lib", "python3*", "site-packages", "bpy", "__init__*"))
		if len(mods) != 1 {
			return nil, false
		}
		files = append(files, mods[0])
	}
	var parts []string
	if len(files) > 1 {
		parts = append(parts, named)
	}
	for _, f := range files {
		resolved, err := filepath.EvalSymlinks(f)
		if err != nil {
			return nil, false
		}
		fi, err := os.Stat(resolved)
		if err != nil || fi.IsDir() {
			return nil, false
		}
		parts = append(parts, resolved, fmt.Sprint(fi.Size()), fmt.Sprint(fi.ModTime().UnixNano()))
	}
	return parts, true
}

// cpuIdentity is this machine's CPU as Cycles sees it (model and feature flags, from
// /proc/cpuinfo); "" where that cannot be read, which caches nothing.
func cpuIdentity() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	var model, flags string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && (model == "" || flags == "") {
		k, v, ok := strings.Cut(sc.Text(), ":")
		switch k = strings.TrimSpace(k); {
		case !ok:
		case k == "model name" && model == "":
			model = strings.TrimSpace(v)
		case k == "flags" && flags == "":
			flags = strings.TrimSpace(v)
		}
	}
	if flags == "" {
		return ""
	}
	return model + "\n" + flags
}

// load is the remembered fingerprint, or "" for none.
func (c buildCache) load() string {
	if c.path == "" {
		return ""
	}
	data, err := os.ReadFile(c.path)
	if err != nil {
		return ""
	}
	var b cachedBuild
	if json.Unmarshal(data, &b) != nil {
		return ""
	}
	return b.Build
}

// store remembers build, written whole (a temporary file renamed) or not at all; a cache that
// cannot be written only means the next start asks Blender again.
func (c buildCache) store(build string) {
	if c.path == "" || build == "" {
		return
	}
	data, err := json.Marshal(cachedBuild{Build: build})
	if err != nil || os.MkdirAll(filepath.Dir(c.path), 0o755) != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".build-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), c.path) != nil {
		os.Remove(tmp.Name())
	}
}

// forget drops the remembered fingerprint.
func (c buildCache) forget() {
	if c.path != "" {
		os.Remove(c.path)
	}
}
