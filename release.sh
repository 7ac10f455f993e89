#!/usr/bin/env bash
# release.sh [DIR] writes tilefarm's release into DIR (default dist/): for every target, an
# archive of coordinator and tileworker (tar.gz for Linux and macOS, zip for Windows, with
# .exe), the Blender add-on's zip, a VERSION file and SHA256SUMS of them all. The version is
# `git describe` of this checkout (with -dirty for uncommitted changes), and each binary's
# --version prints it with the build fingerprint its pools use. TILEFARM_RELEASE_TARGETS
# narrows the targets (e.g. "windows/amd64 linux/arm64"); the default is all six.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-dist}
targets=${TILEFARM_RELEASE_TARGETS:-linux/amd64 linux/arm64 windows/amd64 windows/arm64 darwin/amd64 darwin/arm64}
version=$(git describe --tags --always --dirty 2>/dev/null || echo devel)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tilefarm-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
for target in $targets; do
  os=${target%/*} arch=${target#*/}
  name="tilefarm-$version-$os-$arch"
  echo "building $name..."
  mkdir -p "$work/$name"
  # -trimpath: the archive holds no path of this machine; the version is stamped in
  # (internal/buildinfo).
  GOOS=$os GOARCH=$arch CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/tilefarm/tilefarm/internal/buildinfo.stamped=$version" \
    -o "$work/$name/" ./cmd/coordinator ./cmd/tileworker
  cp README.md "$work/$name/"
  if [ "$os" = windows ]; then
    (cd "$work" && rm -f "$out/$name.zip" && python3 -c 'import sys, zipfile, os
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for root, _, files in os.walk(sys.argv[2]):
        for f in sorted(files):
            z.write(os.path.join(root, f))' "$out/$name.zip" "$name")
  else
    tar -C "$work" -czf "$out/$name.tar.gz" "$name"
  fi
done
go run ./blender/addon/build-zip "$out/tilefarm-addon-$version.zip" >/dev/null
echo "$version" >"$out/VERSION"
(cd "$out" && sha256sum -- *.tar.gz *.zip VERSION 2>/dev/null >SHA256SUMS)
echo "wrote tilefarm $version to $out"
