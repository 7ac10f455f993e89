package miniotest

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// The MinIO this package runs is the one the test command installs: the same version.
func TestMinIOVersionIsTheTestCommands(t *testing.T) {
	data, err := os.ReadFile("../../test.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^MINIO_VERSION=(\S+)$`).FindSubmatch(data)
	if m == nil || string(m[1]) != MinIOVersion {
		t.Fatalf("test.sh installs MinIO %q, the package runs %q", m, MinIOVersion)
	}
}

// Property: with nothing set, the MinIO the test command installed under the cache directory
// is found, so the benchmarks run after ./test.sh as the tests do.
func TestBinaryIsFoundWhereTheTestCommandInstallsIt(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("TILEFARM_MINIO", "")
	t.Setenv("PATH", t.TempDir())
	t.Setenv("GOPATH", t.TempDir())
	if _, err := Binary(); err == nil {
		t.Fatal("a MinIO was found with none installed")
	}
	want := filepath.Join(cache, "tilefarm", "minio-"+MinIOVersion, "minio")
	if err := os.MkdirAll(filepath.Dir(want), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(want, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := Binary(); err != nil || got != want {
		t.Fatalf("Binary() = %q, %v; want %q", got, err, want)
	}
}
